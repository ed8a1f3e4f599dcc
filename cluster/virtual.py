"""Composition root for virtual mode: every role in one process on a virtual-time event loop.

The same role classes as live mode; engines are each other's peers directly (no actors), and time
jumps from event to event, so a run costs only its real work and is deterministic for a seed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from actors.engine.clock import Clock, VirtualTimeLoop
from actors.engine.core import EngineCore, KVSource, Role
from actors.engine.runner import ModelRunner
from actors.messages import ClientRequest, RequestResult
from actors.proxy import Proxy
from cluster.config import TestbedConfig
from workloads.replay import replay
from workloads.results import results_frame
from workloads.summary import summarize
from workloads.synthetic import synthetic_requests


@dataclass
class RunOutput:
    results: pd.DataFrame
    summary: dict[str, Any]
    engine_stats: dict[str, dict[str, Any]]


@dataclass
class Deployment:
    proxy: Proxy
    engines: list[EngineCore]
    clock: Clock


def build_deployment(cfg: TestbedConfig, clock: Clock) -> Deployment:
    """Engines for every pool replica, wired to their peers, and a proxy in front of them."""
    model = None
    if cfg.runner.compute == "real":
        from actors.engine.runner_model import load_model

        model = load_model(cfg.runner)
    peers: dict[str, KVSource] = {}
    pools: dict[Role, list[EngineCore]] = {"mixed": [], "prefill": [], "decode": []}
    for role, pool in (
        ("mixed", cfg.pools.mixed),
        ("prefill", cfg.pools.prefill),
        ("decode", cfg.pools.decode),
    ):
        for i in range(pool.replicas):
            engine = EngineCore(f"{role}-{i}", role, cfg, pool, clock, None, peers)  # type: ignore[arg-type]
            if model is not None:
                engine.runner = ModelRunner(
                    model, engine.num_gpu_blocks, cfg.scheduler.block_size, cfg.runner.num_threads
                )
            pools[role].append(engine)  # type: ignore[index]
    peers.update({e.engine_id: e for e in pools["prefill"]})
    proxy = Proxy(mixed=pools["mixed"], prefill=pools["prefill"], decode=pools["decode"])
    return Deployment(proxy, [e for engines in pools.values() for e in engines], clock)


async def serve(
    cfg: TestbedConfig,
    requests: Sequence[ClientRequest],
    on_result: Callable[[RequestResult], None] | None = None,
) -> tuple[list[RequestResult], Deployment]:
    """Run the requests through a fresh deployment on the current loop; engines are empty afterwards."""
    clock = Clock(1.0)
    dep = build_deployment(cfg, clock)
    tasks = [asyncio.ensure_future(e.run()) for e in dep.engines]
    results = await replay(dep.proxy.submit, requests, clock, on_result)
    for e in dep.engines:
        e.stop()
    await asyncio.gather(*tasks)
    for e in dep.engines:
        e.assert_empty()
    return results, dep


def run_virtual(
    cfg: TestbedConfig,
    requests: Sequence[ClientRequest] | None = None,
    on_result: Callable[[RequestResult], None] | None = None,
) -> RunOutput:
    if requests is None:
        requests = synthetic_requests(cfg.workload, cfg.runner.vocab_size, cfg.seed)
    loop = VirtualTimeLoop()
    try:
        results, dep = loop.run_until_complete(serve(cfg, requests, on_result))
    finally:
        loop.close()
    df = results_frame(results, cfg.design, cfg.workload.rate, cfg.seed)
    stats = {
        e.engine_id: {
            **vars(e.stats),
            "num_preemptions": e.scheduler.num_preemptions,
            "prefix_cache_queries": e.blocks.num_prefix_cache_queries,
            "prefix_cache_hits": e.blocks.num_prefix_cache_hits,
            "num_gpu_blocks": e.num_gpu_blocks,
        }
        for e in dep.engines
    }
    summary = {"design": cfg.design, "rate": cfg.workload.rate, **summarize(df, cfg.slos)}
    return RunOutput(df, summary, stats)
