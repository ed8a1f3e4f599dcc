"""Composition root for live mode: every role a Ray actor, built from the same plain classes.

    driver (replay, live clock) ──submit──► proxy actor ──generate (streamed batches)──► engine actors
                                                                   decode ──get_kv / free_kv──► prefill

Engines run their own step loop inside their actor on a clock shared through a wall-clock epoch; tokens
come back as streamed batches (a request's stream yields at most every `clock.stream_flush_wall_s`), so
nothing crosses an actor boundary per token or per step. Prefill KV moves as numpy arrays through Ray's object
store. Pools are placed by custom resources named after them (`mixed`, `prefill`, `decode`), one unit
per emulated GPU: a TP-8 engine takes 8 units of its pool's resource, all on one node. A local Ray
started here defines them; a joined cluster must offer them (`ray start --resources`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from actors.engine.clock import Clock
from actors.engine.kv_transfer import LinkQueue
from cluster import clock_sync
from cluster.clock_sync import ClockOffset, measure_actor
from cluster.config_load import ConfigError
from cluster.engines import chat_renderer
from cluster.hosts import EncoderHost, EngineHost, ProxyHost, RenderHost
from dashboards.exposition import write_sd_file
from messages import ClientRequest, RequestResult
from target.config import TestbedConfig
from workloads.render_tier import render_tier_for
from workloads.replay import Workload, run_workload, workload_for, workload_info
from workloads.summary import lag_summary

if TYPE_CHECKING:
    from cluster.outcome import RunOutput

_LOCAL_NODE_IP = "127.0.0.2"
"""A local Ray binds a loopback address of its own (Ray rewrites 127.0.0.1 to the host's address)."""
_START_SLACK_S = 0.5
"""Wall seconds between the last actor being ready and emulated time zero."""
_SEND_LEAD_WALL_S = 0.05
"""Requests leave the driver this much ahead of their arrival time: more than driver -> proxy -> engine."""
_TICK_WALL_S = 2.0
"""Wall seconds between progress reports of a live run."""
_FLUSH_WALL_S = {False: 0.05, True: 0.01}
"""clock.stream_flush_wall_s when unset: a replayed run (results carry the stamps, delivery may lag) /
`serve --ray` (a client sees the delivery)."""


def with_stream_flush(cfg: TestbedConfig, serving: bool) -> TestbedConfig:
    """`cfg` with clock.stream_flush_wall_s resolved (as written to the run's config)."""
    if cfg.clock.stream_flush_wall_s is not None:
        return cfg
    return dataclasses.replace(
        cfg, clock=dataclasses.replace(cfg.clock, stream_flush_wall_s=_FLUSH_WALL_S[serving])
    )


@dataclass
class LiveDeployment:
    engines: dict[str, Any]
    """engine id -> actor handle"""
    nodes: dict[str, str]
    """engine id -> Ray node id"""
    proxy: Any
    clock_epoch_s: float
    """Emulated time zero on the driver's monotonic clock."""
    metrics_targets: dict[str, str]
    """actor id (engine ids, `proxy`, `render-i`) -> `host:port` of its /metrics."""
    renders: list[Any] = field(default_factory=list)
    """The render pool's actor handles (only a server renders: replayed traces are token IDs)."""
    link: Any = None
    """The shared link's actor (kv_transfer.link_scope=fabric), else None."""
    encoders: list[Any] = field(default_factory=list)
    """The encoder pool's actor handles (E/P/D)."""
    clock_offsets: dict[str, ClockOffset] = field(default_factory=dict)
    """actor id -> its clock's measured offset to the driver's (`cluster.clock_sync`)."""


def connect(configs: Sequence[TestbedConfig], address: str | None) -> bool:
    """Join Ray (`address`, or the one this process already joined) or start a local one offering
    enough of each pool's resource for every config; True if started here."""
    if ray.is_initialized():
        return False
    if address:
        _check_reachable(address)
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except ConnectionError as e:
            raise ConfigError(f"--address={address}: {e}") from None
        return False
    ray.init(
        _node_ip_address=_LOCAL_NODE_IP,
        num_cpus=os.cpu_count(),
        resources=_resources_needed(configs),
        object_store_memory=512 * 1024**2,
        include_dashboard=False,
        logging_level=logging.WARNING,
    )
    return True


def _check_reachable(address: str) -> None:
    """Fail at once on a head nobody answers at (Ray itself retries for minutes)."""
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    allowed = "allowed: auto (the cluster started on this machine) or HOST:PORT of a running Ray head"
    if not host or not port.isdigit():
        raise ConfigError(f"--address={address}: not HOST:PORT; {allowed}")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise ConfigError(
            f"--address={address}: no Ray head answers there ({e.strerror or e}); {allowed}"
        ) from None


def _resources_needed(configs: Sequence[TestbedConfig]) -> dict[str, float]:
    """Units of each pool's resource a local Ray offers: one per emulated GPU (replicas x tp)."""
    needed: dict[str, float] = {}
    for cfg in configs:
        for role, pool in cfg.pools.by_role():
            needed[role] = max(needed.get(role, 0), pool.replicas * pool.tp)
    return needed


def disconnect() -> None:
    """Stop the Ray this process started (all its processes) or leave the one it joined."""
    ray.shutdown()


def _check_resources(cfg: TestbedConfig) -> None:
    """Each pool's engines fit the nodes' units of its resource, `tp` of them on one node per engine
    (an engine that cannot place would wait forever)."""
    per_node = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    for role, pool in cfg.pools.by_role():
        units = [r.get(role, 0.0) for r in per_node]
        if pool.replicas and sum(int(u // pool.tp) for u in units) < pool.replicas:
            raise ConfigError(
                f"pools.{role}: {pool.replicas} replica(s) x tp={pool.tp} need {pool.tp} '{role}' "
                f"resource units on one node each; the Ray cluster's nodes offer {sum(units):g} in all "
                f"(at most {max(units, default=0.0):g} on one node); allowed: start nodes with "
                f"--resources='{{\"{role}\": N}}' (one unit per GPU)"
            )


def deploy(cfg: TestbedConfig, render: bool = False) -> LiveDeployment:
    """Create and start every actor (and the render pool's if `render`); emulated time zero is shortly
    after the last one is ready."""
    cfg = with_stream_flush(cfg, serving=render)
    _check_resources(cfg)
    if cfg.runner.compute == "real":
        from actors.engine.runner_model import ensure_model

        ensure_model(cfg.runner)  # build once here, so actors on this node only load it
    host = ray.remote(EngineHost)
    fabric = None
    if cfg.kv_transfer.link_scope == "fabric":
        fabric = ray.remote(LinkQueue).options(num_cpus=0).remote()
    pools: dict[str, dict[str, Any]] = {"mixed": {}, "prefill": {}, "decode": {}}
    for role, pool in cfg.pools.by_role():
        for i in range(pool.replicas):
            eid = f"{role}-{i}"
            opts = {"num_cpus": 0, "num_gpus": cfg.runner.num_gpus, "resources": {role: pool.tp}}
            peers = dict(pools["prefill"]) if role == "decode" else {}
            pools[role][eid] = host.options(**opts).remote(
                eid, role, i, cfg, pool, peers, fabric if role == "prefill" else None
            )
    if cfg.kv_transfer.bidirectional:  # prefill pulls a conversation's blocks back from decode
        ray.get([h.add_peers.remote(dict(pools["decode"])) for h in pools["prefill"].values()])
    engines = {eid: h for per in pools.values() for eid, h in per.items()}
    nodes = dict(zip(engines, ray.get([h.node_id.remote() for h in engines.values()]), strict=True))
    renders: list[Any] = [
        ray.remote(RenderHost).options(num_cpus=0).remote(cfg, i)
        for i in range(cfg.render.replicas if render else 0)
    ]
    encoders: list[Any] = [
        ray.remote(EncoderHost).options(num_cpus=0).remote(f"encoder-{i}", i, cfg)
        for i in range(cfg.pools.encoder.replicas)
    ]
    proxy: Any = ray.remote(ProxyHost).options(num_cpus=0).remote(cfg, pools, renders, encoders)
    targets = {"proxy": ray.get(proxy.start.remote())}
    targets.update({f"render-{i}": t for i, t in enumerate(ray.get([h.start.remote() for h in renders]))})
    dep = LiveDeployment(engines, nodes, proxy, 0.0, targets, renders, fabric, encoders)
    timed = {"proxy": proxy, **engines, **{f"encoder-{i}": h for i, h in enumerate(encoders)}}
    dep.clock_offsets = {actor: measure_actor(h) for actor, h in timed.items()}
    try:
        clock_sync.check(dep.clock_offsets, cfg.clock.max_sync_uncertainty_s)
    except ConfigError:
        kill(dep)
        raise
    epoch = dep.clock_epoch_s = time.monotonic() + _START_SLACK_S
    offset = {actor: o.offset_s for actor, o in dep.clock_offsets.items()}
    encoder_targets = ray.get([h.start.remote(epoch, offset[f"encoder-{i}"]) for i, h in enumerate(encoders)])
    targets.update({f"encoder-{i}": t for i, t in enumerate(encoder_targets)})
    started = ray.get(
        [
            proxy.join_clock.remote(epoch, offset["proxy"]),
            *[h.start.remote(epoch, offset[e]) for e, h in engines.items()],
        ]
    )
    targets.update(zip(engines, started[1:], strict=True))
    write_sd_file(cfg.metrics.sd_file, cfg.design, targets)
    return dep


async def drive(
    dep: LiveDeployment,
    cfg: TestbedConfig,
    requests: Workload,
    on_result: Callable[[RequestResult], None] | None = None,
    on_tick: Callable[[float, dict[str, Any]], None] | None = None,
) -> list[RequestResult]:
    """Send each request at its emulated arrival time through the proxy actor; collect every result.

    `on_tick(sim_now_s, lag)` is called about every `_TICK_WALL_S` with the engines' lag so far.
    """
    clock = Clock(cfg.clock.scale, epoch_s=dep.clock_epoch_s)

    async def submit(creq: ClientRequest) -> RequestResult:
        result: RequestResult = await dep.proxy.submit.remote(creq)
        return result

    async def ticks() -> None:
        while on_tick is not None:
            await asyncio.sleep(_TICK_WALL_S)
            alive = {}
            for eid, h in dep.engines.items():
                with contextlib.suppress(ray.exceptions.RayActorError):
                    alive[eid] = await h.report.remote()
            on_tick(clock.now(), lag_summary(alive))

    async def strike(kind: str, engine_id: str, at_s: float) -> None:  # faults.engine_kills / _hangs
        await clock.sleep_until(at_s)
        if kind == "engine_kills":  # the actor dies
            ray.kill(dep.engines[engine_id])
        else:  # its step loop stops
            await dep.engines[engine_id].hang.remote(f"at {at_s:g} s (faults.{kind})")

    ticker = asyncio.ensure_future(ticks())
    kinds = ("engine_kills", "engine_hangs")
    faults = [
        asyncio.ensure_future(strike(k, f.engine, f.at_s)) for k in kinds for f in getattr(cfg.faults, k)
    ]
    try:
        lead_s = _SEND_LEAD_WALL_S / cfg.clock.scale
        render_chat = chat_renderer(cfg, requests)
        tier = render_tier_for(cfg)
        return await run_workload(submit, requests, clock, cfg, tier, on_result, lead_s, render_chat)
    finally:
        for task in (ticker, *faults):
            task.cancel()


def run_live(
    cfg: TestbedConfig,
    address: str | None = None,
    requests: Workload | None = None,
    on_result: Callable[[RequestResult], None] | None = None,
    on_tick: Callable[[float, dict[str, Any]], None] | None = None,
    on_deployed: Callable[[LiveDeployment], None] | None = None,
) -> RunOutput:
    """One live run: join or start Ray, deploy, replay, drain; a Ray started here is stopped again."""
    from cluster.outcome import run_output  # pandas: the driver's, not every actor's, import

    cfg = with_stream_flush(cfg, serving=False)
    started = connect([cfg], address)
    dep = None
    try:
        dep = deploy(cfg)
        if on_deployed is not None:
            on_deployed(dep)
        if requests is None:
            requests = workload_for(cfg)
        results = asyncio.run(drive(dep, cfg, requests, on_result, on_tick))
        time.sleep(cfg.metrics.linger_s)
        reports, metrics = shutdown(dep, cfg)
        offsets, dep = dep.clock_offsets, None
        out = run_output(cfg, results, reports, metrics, workload_info(requests, cfg.replay.speedup))
        out.summary["clock_sync"] = clock_sync.sync_summary(offsets)
        return out
    finally:
        if dep is not None:
            kill(dep)
        if started:
            disconnect()


def shutdown(dep: LiveDeployment, cfg: TestbedConfig) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Drain every live engine (dead ones are skipped) and render replica (checked empty), collect every
    actor's final metrics, kill all actors and withdraw their scrape targets; engine reports and
    expositions by actor id."""
    reports: dict[str, dict[str, Any]] = {}
    metrics: dict[str, str] = {}
    lost = (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)
    for eid, handle in dep.engines.items():
        try:
            reports[eid] = ray.get(handle.drain.remote(), timeout=60)
            metrics[eid] = ray.get(handle.metrics.remote(), timeout=60)
        except lost as e:
            reports[eid] = {"error": f"{type(e).__name__}: not drained"}
    with contextlib.suppress(*lost):
        metrics["proxy"] = ray.get(dep.proxy.metrics.remote(), timeout=60)
    for i, handle in enumerate(dep.renders):
        with contextlib.suppress(*lost):
            ray.get(handle.drain.remote(), timeout=60)
            metrics[f"render-{i}"] = ray.get(handle.metrics.remote(), timeout=60)
    for i, handle in enumerate(dep.encoders):
        with contextlib.suppress(*lost):
            ray.get(handle.drain.remote(), timeout=60)
            metrics[f"encoder-{i}"] = ray.get(handle.metrics.remote(), timeout=60)
    kill(dep)
    write_sd_file(cfg.metrics.sd_file, cfg.design, {})
    return reports, metrics


def kill(dep: LiveDeployment) -> None:
    for handle in [
        *dep.engines.values(),
        dep.proxy,
        *dep.renders,
        *dep.encoders,
        *([dep.link] if dep.link else []),
    ]:
        ray.kill(handle)
