"""An FFN rank: every MoE layer's sparse block (router, then experts) of the runner model, and nothing else.

The engine's runner computes each layer's attention and sends the normed hidden states of the rows its
attention ranks hold (`messages.afd.FfnBatch`); the rank routes them, runs the chosen experts and sends
back their output and the router's choices (`FfnOutput`). Which rows come to which rank is the attention
side's choice (`actors.engine.runner.ffn_client`); a rank computes whatever rows it is sent, each row on
its own.

What a rank holds: the `Qwen3MoeSparseMoeBlock` of each sparse layer (its router's weight, its experts'
gate/up/down projections), loaded from the checkpoint the engine's runner model loads (the seeded tiny
model in the cache, or `runner.model_path`); the embeddings, attention, norms and head are dropped once
loaded. Every rank holds every expert: how the emulated FFN rank shards them (`afd.ffn_ep`) is the time
model's business, not the compute's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from transformers import AutoModelForCausalLM
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from messages.afd import FfnBatch, FfnOutput

_LOADED: dict[tuple[str, str], dict[int, Qwen3MoeSparseMoeBlock]] = {}


def load_moe_blocks(path: str, device: str) -> dict[int, Qwen3MoeSparseMoeBlock]:
    """The sparse MoE blocks of the checkpoint at `path` by layer index, on `device`: loaded once per
    process and shared read-only by its workers (virtual mode builds every rank in one process)."""
    if (path, device) not in _LOADED:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
        blocks = {
            i: layer.mlp
            for i, layer in enumerate(model.model.layers)
            if isinstance(layer.mlp, Qwen3MoeSparseMoeBlock)
        }
        del model  # (the blocks keep only their own weights)
        for block in blocks.values():
            block.requires_grad_(False)
            block.to(device).eval()
        _LOADED[path, device] = blocks
    return _LOADED[path, device]


class FfnWorker:
    """One FFN rank of an AFD replica: `forward` one layer's batch of rows at a time."""

    def __init__(self, blocks: Mapping[int, Qwen3MoeSparseMoeBlock], device: str = "cpu") -> None:
        """`blocks`: each sparse layer's MoE block by layer index (`load_moe_blocks`)."""
        self._blocks = dict(blocks)
        self.device = device

    @classmethod
    def load(cls, path: str, device: str) -> FfnWorker:
        """A worker over the MoE blocks of the checkpoint at `path`."""
        return cls(load_moe_blocks(path, device), device)

    @property
    def layers(self) -> list[int]:
        """The layers whose MoE block this rank computes."""
        return sorted(self._blocks)

    @torch.inference_mode()
    def forward(self, batch: FfnBatch) -> FfnOutput:
        """The layer's MoE block on the batch's rows: the router's top-k experts and weights (`gate`),
        then those experts (`experts`), which is all the block's own forward does on rows."""
        block = self._blocks[batch.layer]
        # a batch from Ray's object store is a read-only view: torch wants a buffer it may write
        h = torch.from_numpy(np.require(batch.hidden_states, requirements="W")).to(self.device)
        _, weights, chosen = block.gate(h)
        out = block.experts(h, chosen, weights)
        return FfnOutput(out.cpu().numpy(), chosen.cpu().numpy())


class LocalFfnRanks:
    """An AFD replica's FFN ranks in this process (virtual mode), called one after another; the engine's
    runner sees them as its `FfnRanks` (`actors.engine.runner.ffn_client`)."""

    def __init__(self, workers: Sequence[FfnWorker]) -> None:
        self.workers = list(workers)

    @property
    def num_ranks(self) -> int:
        return len(self.workers)

    def forward(self, batches: Sequence[FfnBatch | None]) -> list[FfnOutput | None]:
        """Each rank's output for its batch (None: the rank has no rows this step and is not called)."""
        return [None if b is None else w.forward(b) for w, b in zip(self.workers, batches, strict=True)]
