"""An AFD replica's FFN ranks as actors: a rank's actor body (`FfnHost`), the client that makes a
replica's ranks look like the runner's `FfnRanks` (`RemoteFfnRanks`), and their creation (`ffn_actors`).

    engine actor (runner, in its compute thread) ──forward.remote × F, ray.get──► FfnHost × F (experts)

Per MoE layer of a step the runner sends every FFN rank its rows at once and waits for all: F calls in
flight, one round trip per layer. The hidden states are numpy arrays (Ray's object store holds those over
its inline limit, zero-copy on the reading side). The calls come from the engine's compute thread
(`Executor(in_thread=True)`), so `ray.get` blocks that thread, never the engine's event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray

from cluster.placement import ffn_options
from emulation.config import PoolConfig, TestbedConfig
from messages.afd import FfnBatch, FfnOutput


class FfnHost:
    """The body of an FFN rank's actor: the MoE blocks of the runner's checkpoint, nothing else."""

    def __init__(self, cfg: TestbedConfig) -> None:
        import torch  # (here: torch loads only where something computes)

        from actors.engine.runner.tiny_model import ensure_model, runner_device
        from actors.ffn.worker import FfnWorker

        torch.set_num_threads(cfg.runner.num_threads)
        r = cfg.runner
        # the checkpoint the engines load (built here from its seed if this node has none yet)
        self._worker = FfnWorker.load(str(ensure_model(r)), runner_device(r))

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def forward(self, batch: FfnBatch) -> FfnOutput:
        return self._worker.forward(batch)


class RemoteFfnRanks:
    """A replica's FFN rank actors seen as the runner's `FfnRanks`: all ranks' calls of a layer at once."""

    def __init__(self, handles: Sequence[Any]) -> None:
        self._handles = list(handles)

    @property
    def num_ranks(self) -> int:
        return len(self._handles)

    def forward(self, batches: Sequence[FfnBatch | None]) -> list[FfnOutput | None]:
        pairs = zip(self._handles, batches, strict=True)
        refs = [None if b is None else h.forward.remote(b) for h, b in pairs]  # all in flight, then wait
        got = iter(ray.get([r for r in refs if r is not None]))
        return [None if r is None else next(got) for r in refs]


def ffn_actors(cfg: TestbedConfig, pool: PoolConfig) -> list[Any]:
    """The FFN rank actors of one replica of `pool`: none without AFD, or with compute skip (nothing
    computes)."""
    if pool.afd is None or cfg.runner.compute != "real":
        return []
    in_all = sum(p.replicas * p.afd.num_ffn_ranks for _, p in cfg.pools.by_role() if p.afd is not None)
    options = ffn_options(pool.afd, in_all, cfg.runner.num_gpus)
    return [ray.remote(FfnHost).options(**options).remote(cfg) for _ in range(pool.afd.num_ffn_ranks)]
