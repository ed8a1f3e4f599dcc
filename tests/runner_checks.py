"""What the runner tests share: seeded prompts, the logits a runner's steps computed, and the model's own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def prompt(n: int, seed: int = 0, vocab: int = 8192) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()  # type: ignore[no-any-return]


@contextmanager
def logits_of(runner: Any) -> Iterator[list[torch.Tensor]]:
    """The logits the runner's steps computed (rows: the items that asked, in order), one per step."""
    steps: list[torch.Tensor] = []
    hook = runner.model.lm_head.register_forward_hook(lambda _m, _i, out: steps.append(out.clone()))
    try:
        yield steps
    finally:
        hook.remove()


def hf_logits(model: Any, tokens: list[int]) -> torch.Tensor:
    """The model's own forward over `tokens` (no cache): its logits at every position."""
    with torch.inference_mode():
        return model(torch.tensor([tokens])).logits[0]  # type: ignore[no-any-return]
