"""Composition root for virtual mode: every role in one process on a virtual-time event loop.

The same role classes as live mode; engines are each other's peers directly (no actors), and time
jumps from event to event, so a run costs only its real work and is deterministic for a seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from actors.encoder.encoder import EncoderCore
from actors.engine.clock import Clock, VirtualTimeLoop
from actors.engine.core import EngineCore, Role
from actors.engine.kv_connectors.pd_worker import KVSource
from actors.engine.kv_connectors.transfer import LinkQueue
from actors.engine_pool import watch_health
from actors.kv_store import KVStore
from actors.proxy import Proxy
from cluster.engines import (
    build_encoder,
    build_engine,
    chat_renderer,
    encoder_pool,
    kv_store_args,
    runner_for,
)
from cluster.outcome import RunOutput, run_output
from dashboards.exposition import Expositions
from dashboards.recorders import EncoderMetrics, EngineMetrics, ProxyMetrics
from emulation.config import TestbedConfig, replica_id
from messages import RenderSpec, RequestResult
from workloads.render_tier import RenderTier, render_tier_for
from workloads.replay import LoadedWorkload, Workload, load_workload, run_workload
from workloads.run_summary import DeploymentFigures


@dataclass
class Deployment:
    proxy: Proxy
    engines: list[EngineCore]
    clock: Clock
    engine_metrics: list[EngineMetrics]
    """Each engine's series, in the order of `engines` (none when built without metrics)."""
    proxy_metrics: ProxyMetrics | None
    render: RenderTier
    """The render tier's cost model, for replayed requests (token IDs: nothing renders)."""
    cfg: TestbedConfig
    encoders: list[EncoderCore] = field(default_factory=list)
    """The encoder pool (E/P/D), in front of prefill."""
    encoder_metrics: list[EncoderMetrics] = field(default_factory=list)
    _tasks: list[asyncio.Future[None]] = field(default_factory=list)
    """The fault injections and the proxy's health checks."""
    num_proxy_restarts: int = 0
    """Proxy kills met (`faults.proxy_kills`)."""

    @property
    def roles(self) -> list[EngineCore | EncoderCore]:
        """Every engine and encoder: what has a step loop."""
        return [*self.engines, *self.encoders]

    def start(self) -> None:
        """Start every step loop, the engine kills and hangs the config injects (`faults`) and the
        proxy's health checks (in virtual time, while kills are due: nothing else kills an engine, and
        a timer for ever would hide a deadlock)."""
        for e in self.roles:
            e.start()
        engines = {e.engine_id: e for e in self.engines}
        f = self.cfg.faults
        interval_s = self.cfg.router.health_check_interval_s
        self._tasks = [
            *(asyncio.ensure_future(self._strike(engines[k.engine], "kill", k.at_s)) for k in f.engine_kills),
            *(asyncio.ensure_future(self._strike(engines[h.engine], "hang", h.at_s)) for h in f.engine_hangs),
            *(asyncio.ensure_future(self._kill_proxy(at_s)) for at_s in f.proxy_kills),
        ]
        if interval_s is not None and (f.engine_kills or not self.clock.virtual):
            until_s = max(k.at_s for k in f.engine_kills) + interval_s if self.clock.virtual else None
            watch = watch_health(self.proxy.pools, self.clock, interval_s, until_s)
            self._tasks.append(asyncio.ensure_future(watch))

    async def _strike(self, engine: EngineCore, fault: Literal["kill", "hang"], at_s: float) -> None:
        await self.clock.sleep_until(at_s)
        engine.inject(fault, f"at {at_s:g} s (faults.engine_{fault}s)")

    async def _kill_proxy(self, at_s: float) -> None:
        await self.clock.sleep_until(at_s)
        self.proxy.kill(f"proxy killed at {at_s:g} s (faults.proxy_kills)")
        self.num_proxy_restarts += 1

    async def drain(self) -> None:
        """Stop every engine and release KV nobody will pull (then each can be checked empty); faults not
        due yet are dropped."""
        for task in self._tasks:
            task.cancel()
        outcomes = await asyncio.gather(*(e.drain() for e in self.roles), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):  # an engine crashed: every drain still ran
                raise outcome

    def assert_empty(self) -> None:
        """No request, block, stream, working KV or encoder job left (after `drain`)."""
        for e in self.roles:
            e.assert_empty()

    def expositions(self) -> Expositions:
        """Every role's final metrics by actor id (engine ids, `proxy`), rendered when read (none when
        built without metrics)."""
        out = {}
        if self.engine_metrics:  # built with metrics
            out = {e.engine_id: m.exposition for e, m in zip(self.engines, self.engine_metrics, strict=True)}
            out.update(
                {e.encoder_id: m.exposition for e, m in zip(self.encoders, self.encoder_metrics, strict=True)}
            )
        if self.proxy_metrics is not None:
            out["proxy"] = self.proxy_metrics.exposition
        return Expositions(out)


def build_deployment(
    cfg: TestbedConfig,
    clock: Clock,
    compute_in_thread: bool = False,
    render: Callable[[RenderSpec], Awaitable[list[int]]] | None = None,
    metrics: bool = True,
) -> Deployment:
    """Engines for every pool replica, wired to their peers, and a proxy in front of them (which
    renders again with `render` when decode cannot reuse prefill's prompt IDs).
    `compute_in_thread`: on a real-time loop (serve), compute off the loop. `metrics`: False records
    nothing (the run's summary reads the roles' own counters), for runs whose metrics nobody reads."""
    peers: dict[str, KVSource] = {}
    pools: dict[Role, list[EngineCore]] = {"mixed": [], "prefill": [], "decode": []}
    engine_metrics: list[EngineMetrics] = []
    fabric = LinkQueue() if cfg.kv_transfer.link_scope == "fabric" else None
    kv_store = KVStore(*kv_store_args(cfg)) if cfg.kv_offload.shared_gb else None
    for role, pool in cfg.pools.by_role():
        for i in range(pool.replicas):
            if metrics:
                engine_metrics.append(EngineMetrics(cfg, role, i))
            engine = build_engine(
                replica_id(role, i),
                role,
                cfg,
                pool,
                clock,
                runner_for(cfg, pool),
                peers,
                engine_metrics[-1] if metrics else None,
                compute_in_thread,
                fabric,
                kv_store=kv_store,
            )
            pools[role].append(engine)
    peers.update({e.engine_id: e for e in pools["prefill"]})
    if cfg.kv_transfer.bidirectional:  # prefill pulls a conversation's blocks back from decode
        peers.update({e.engine_id: e for e in pools["decode"]})
    encoder_metrics = [EncoderMetrics(cfg, i) for i in range(cfg.pools.encoder.replicas)] if metrics else []
    encoders = [
        build_encoder(replica_id("encoder", i), cfg, clock, compute_in_thread, m)
        for i, m in enumerate(encoder_metrics or [None] * cfg.pools.encoder.replicas)
    ]
    proxy_metrics = ProxyMetrics(cfg) if metrics else None
    push = cfg.kv_transfer.mode == "push"
    proxy = Proxy(
        mixed=pools["mixed"],
        prefill=pools["prefill"],
        decode=pools["decode"],
        recorder=proxy_metrics,
        render=render,
        push=push,
        clock=clock,
        router=cfg.router,
        block_size=cfg.scheduler.block_size,
        bidirectional=cfg.kv_transfer.bidirectional,
        encoders=encoder_pool(cfg, encoders),
    )
    engines = [e for engines in pools.values() for e in engines]
    for e in engines:  # in process: the KV events go straight to the routers that read them
        if cfg.router.policy_for(e.role) == "kv_aware":
            proxy.listen_kv_events(e)
    tier = render_tier_for(cfg)
    return Deployment(
        proxy, engines, clock, engine_metrics, proxy_metrics, tier, cfg, encoders, encoder_metrics
    )


async def serve(
    cfg: TestbedConfig,
    requests: Workload,
    on_result: Callable[[RequestResult], None] | None = None,
    metrics: bool = True,
) -> tuple[list[RequestResult], Deployment]:
    """Run the requests (or trace) through a fresh deployment on the current loop; engines are empty
    afterwards. `metrics`: see `build_deployment`."""
    dep = build_deployment(cfg, Clock(1.0), metrics=metrics)
    return await replay_on(dep, requests, on_result), dep


async def replay_on(
    dep: Deployment,
    requests: Workload,
    on_result: Callable[[RequestResult], None] | None = None,
) -> list[RequestResult]:
    """Start `dep`'s engines, replay the requests (or trace) through its proxy, drain; engines are
    checked empty."""
    dep.start()
    render_chat = chat_renderer(dep.cfg, requests)
    results = await run_workload(
        dep.proxy.submit, requests, dep.clock, dep.cfg, dep.render, on_result, render_chat=render_chat
    )
    await dep.drain()
    dep.assert_empty()
    return results


def run_virtual(
    cfg: TestbedConfig,
    requests: Workload | LoadedWorkload | None = None,
    on_result: Callable[[RequestResult], None] | None = None,
    metrics: bool = True,
) -> RunOutput:
    """A fresh deployment replays `requests` (default: the config's workload; `LoadedWorkload`: one
    loaded and measured already) in virtual time. `metrics`: see `build_deployment`."""
    loaded = load_workload(cfg, requests)
    loop = VirtualTimeLoop()
    with _collecting_rarely():
        try:
            with _interrupted_between_events(loop):
                results, dep = loop.run_until_complete(serve(cfg, loaded.workload, on_result, metrics))
        except KeyboardInterrupt:
            _cancel_all(loop)
            raise
        finally:
            loop.close()
        reports = {e.engine_id: e.report() for e in dep.engines}
        restarts: DeploymentFigures = {"num_proxy_restarts": dep.num_proxy_restarts}
        encoder_stats = [e.stats() for e in dep.encoders]
        return run_output(cfg, results, reports, dep.expositions(), loaded.info, restarts, encoder_stats)


@contextlib.contextmanager
def _interrupted_between_events(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt from a callback of `loop` of its own, between two events, not
    inside whichever task happens to run (which would end with it, "exception never retrieved"). Not
    where Ctrl-C is ignored or cannot be caught (a thread)."""
    ignored = signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, None)
    if ignored or threading.current_thread() is not threading.main_thread():
        yield
        return

    # (not `loop.add_signal_handler`: its wake-up comes through a pipe this loop's selector never reads)
    def on_sigint(*_: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # once: a second Ctrl-C would break the clean-up
        loop.call_soon_threadsafe(_interrupt)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt() -> None:
    raise KeyboardInterrupt


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    """Ctrl-C stopped `loop` mid-run: its tasks are cancelled and run to their end (left pending, each
    would say "Task was destroyed but it is pending" when collected)."""
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


RARE_GC_THRESHOLDS = (50_000, 20, 100)
"""Python's cycle collector every 50,000 container allocations rather than 700 (`gc.set_threshold`)."""


@contextlib.contextmanager
def _collecting_rarely() -> Iterator[None]:
    """`RARE_GC_THRESHOLDS` for the run and its tables: a run allocates millions of short-lived
    containers (tasks, outputs, token lists) that reference counting frees, and at the default it
    collected ~180 times in a Mooncake replay, 6 % of its time (and building its tables, with the
    whole deployment still alive, 3 % more). The thresholds are restored after (a sweep's worker
    processes keep them throughout: `sweep.run_in_processes`)."""
    thresholds = gc.get_threshold()
    gc.set_threshold(*RARE_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
