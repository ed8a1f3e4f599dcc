"""Composition root for virtual mode: every role in one process on a virtual-time event loop.

The same role classes as live mode; engines are each other's peers directly (no actors), and time
jumps from event to event, so a run costs only its real work and is deterministic for a seed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from actors.engine.clock import Clock, VirtualTimeLoop
from actors.engine.core import EngineCore, KVSource, Role, runner_for
from actors.messages import ClientRequest, RenderSpec, RequestResult
from actors.proxy import Proxy
from cluster.config import TestbedConfig
from cluster.outcome import RunOutput, run_output
from dashboards.recorders import ProxyMetrics
from workloads.replay import replay
from workloads.synthetic import synthetic_requests


@dataclass
class Deployment:
    proxy: Proxy
    engines: list[EngineCore]
    clock: Clock


def build_deployment(
    cfg: TestbedConfig,
    clock: Clock,
    compute_in_thread: bool = False,
    render: Callable[[RenderSpec], Awaitable[list[int]]] | None = None,
) -> Deployment:
    """Engines for every pool replica, wired to their peers, and a proxy in front of them (which
    renders again with `render` when decode cannot reuse prefill's prompt IDs).
    `compute_in_thread`: on a real-time loop (serve), compute off the loop."""
    peers: dict[str, KVSource] = {}
    pools: dict[Role, list[EngineCore]] = {"mixed": [], "prefill": [], "decode": []}
    for role, pool in cfg.pools.by_role():
        for i in range(pool.replicas):
            pools[role].append(
                EngineCore(
                    f"{role}-{i}",
                    role,
                    cfg,
                    pool,
                    clock,
                    runner_for(cfg, pool),
                    peers,
                    compute_in_thread=compute_in_thread,
                    replica=i,
                )
            )
    peers.update({e.engine_id: e for e in pools["prefill"]})
    proxy = Proxy(pools["mixed"], pools["prefill"], pools["decode"], ProxyMetrics(cfg), render)
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
    metrics = {e.engine_id: e.metrics.exposition() for e in dep.engines}
    assert dep.proxy.metrics is not None
    metrics["proxy"] = dep.proxy.metrics.exposition()
    return run_output(cfg, results, {e.engine_id: e.report() for e in dep.engines}, metrics)
