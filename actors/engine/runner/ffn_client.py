"""The attention side of attention-FFN disaggregation (AFD): which FFN rank computes which rows of a
step, and one MoE layer's crossing to the FFN ranks and back.

An AFD replica is A attention ranks (this engine: its scheduler, KV and sampling hold all A ranks'
requests, and its runner computes them all) and F FFN ranks holding the experts (`actors.ffn`). Each
request lives on one attention rank; FFN rank j serves attention ranks j·A/F .. (j+1)·A/F - 1 (vLLM's
AFD plugin's mapping), so a step's rows go to FFN ranks by request::

    request   r0  r1  r2  r3        attention rank  crc32(request_id) % A       (A = 4, F = 2)
    rank       2   0   3   0        FFN rank        attention rank // (A / F)
    FFN rank   1   0   1   0        rows sent       FFN 0: r1's, r3's; FFN 1: r0's, r2's

At every MoE layer the runner sends each FFN rank the normed hidden states of its rows (one call per rank
per layer per step, all ranks' calls in flight together), and scatters the outputs back into the step's
row order; the residual add stays on the attention side, as does every dense layer's MLP.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from messages.afd import FfnBatch, FfnOutput


class FfnRanks(Protocol):
    """An AFD replica's FFN ranks as the runner calls them; the composition root supplies them (in
    process, or Ray actors)."""

    @property
    def num_ranks(self) -> int: ...

    def forward(self, batches: Sequence[FfnBatch | None]) -> list[FfnOutput | None]:
        """Rank j's output for `batches[j]` (None: no rows for rank j this step; it is not called), every
        rank's call in flight at once; returns when all have answered."""
        ...


def attention_rank(request_id: str, num_attention_ranks: int) -> int:
    """The attention rank a request lives on: crc32 of its id, modulo A. Stable across its steps (and
    across processes and runs: Python's `hash` of a str is salted per process); not balanced per step,
    as a real DP scheduler's choice at admission would be, which the time model does not read."""
    return zlib.crc32(request_id.encode()) % num_attention_ranks


class AfdConnector:
    """The runner's side of the cut (vLLM's AFD connector): rows to FFN ranks and outputs back."""

    def __init__(self, ranks: FfnRanks, num_attention_ranks: int) -> None:
        """`num_attention_ranks`: A, a multiple of the ranks' F (checked with the config)."""
        num_ffn_ranks = ranks.num_ranks
        assert num_attention_ranks % num_ffn_ranks == 0, (num_attention_ranks, num_ffn_ranks)
        self.ranks = ranks
        self.num_attention_ranks = num_attention_ranks
        self.num_ffn_ranks = num_ffn_ranks
        self._per_ffn_rank = num_attention_ranks // num_ffn_ranks

    def ffn_rank(self, request_id: str) -> int:
        return attention_rank(request_id, self.num_attention_ranks) // self._per_ffn_rank

    def rows(self, requests: Sequence[tuple[str, int]], device: torch.device) -> list[torch.Tensor | None]:
        """For a step's packed batch of (request id, new tokens) in order: each FFN rank's row indices
        into it (None: no rows), on the batch's `device`; the same at every layer of the step."""
        per_rank: list[list[int]] = [[] for _ in range(self.num_ffn_ranks)]
        offset = 0
        for request_id, n in requests:
            per_rank[self.ffn_rank(request_id)].extend(range(offset, offset + n))
            offset += n
        return [torch.tensor(r, dtype=torch.long, device=device) if r else None for r in per_rank]

    def mlp(
        self, layer: int, h: torch.Tensor, rows: Sequence[torch.Tensor | None]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s MoE block on the packed batch `h` [num_tokens, hidden] (normed), computed by
        the FFN ranks: its output and the router's choices [num_tokens, top_k], rows in `h`'s order."""
        batches = [None if r is None else FfnBatch(layer, h[r].cpu().numpy()) for r in rows]
        outputs = self.ranks.forward(batches)
        out = torch.empty_like(h)
        chosen: torch.Tensor | None = None
        for r, o in zip(rows, outputs, strict=True):
            if r is None or o is None:
                continue
            if chosen is None:
                top_k = o.chosen_experts.shape[1]
                chosen = torch.empty((h.shape[0], top_k), dtype=torch.long, device=h.device)
            out[r] = _tensor(o.hidden_states).to(h)
            chosen[r] = _tensor(o.chosen_experts).to(chosen)
        assert chosen is not None, "a step has rows"
        return out, chosen


def _tensor(a: np.ndarray) -> torch.Tensor:
    """`a` as a tensor, copied only where it is read-only (a view into Ray's object store)."""
    return torch.from_numpy(np.require(a, requirements="W"))
