"""Composition root for live mode: every role a Ray actor, built from the same plain classes.

    driver (replay, live clock) ──submit──► proxy actor ──generate (streamed batches)──► engine actors
                                                                   decode ──get_kv / free_kv──► prefill

Engines run their own step loop inside their actor on one clock (the driver's, through each actor's
measured offset: `cluster.clock_sync`); tokens come back as streamed batches (a request's stream yields
at most every `clock.stream_flush_wall_s`), so nothing crosses an actor boundary per token or per step.
Prefill KV moves as numpy arrays through Ray's object store; so do an AFD engine's hidden states to its
FFN rank actors and back (`hosts.ffn`; nodes offering an `ffn` resource take them). Pools are placed by
custom resources named after them (`mixed`, `prefill`, `decode`), one unit per emulated GPU: a TP-8
engine takes 8 units of its pool's resource, all on one node. A local Ray started here defines them; a
joined cluster must offer them (`ray start --resources`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from actors.engine.clock import Clock
from actors.engine.kv_connectors.transfer import LinkQueue
from actors.kv_store import KVStore
from cluster.clock_sync import ClockOffset, check_uncertainty, measure_actor, sync_summary
from cluster.config_load import ConfigError
from cluster.engines import chat_renderer, kv_store_args
from cluster.hosts import EncoderHost, EngineHost, ProxyHost, RenderHost, ffn_actors
from cluster.live_shutdown import ffn_handles, kill, shutdown
from cluster.placement import EnginePlacement, engine_placement, rank_nodes, release
from cluster.ray_connect import check_resources, connect, disconnect
from dashboards.exposition import write_sd_file
from emulation.config import TestbedConfig, replica_id
from messages import ClientRequest, RequestResult
from workloads.render_tier import render_tier_for
from workloads.replay import LoadedWorkload, Workload, load_workload, run_workload
from workloads.run_summary import DeploymentFigures, LagFigures
from workloads.summary import lag_summary

if TYPE_CHECKING:
    from cluster.outcome import RunOutput

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
    proxy_args: tuple[Any, ...] = ()
    """What the proxy actor is made from (a dead one is replaced: `replace_proxy`)."""
    spare_proxies: list[Any] = field(default_factory=list)
    """Proxy actors made ahead, one per kill the config injects: starting an actor's process takes a
    second or two of CPU, which on a small host would make the engines' steps lag at the kill."""
    clock_offsets: dict[str, ClockOffset] = field(default_factory=dict)
    """actor id -> its clock's measured offset to the driver's (`cluster.clock_sync`)."""
    num_proxy_restarts: int = 0
    """Times the proxy actor died and was replaced (`replace_proxy`)."""
    replacing: asyncio.Future[None] | None = None
    """The proxy's replacement under way (`replace_proxy`)."""
    placements: dict[str, EnginePlacement] = field(default_factory=dict)
    """engine id -> where it and (expert parallel) its ranks' units are (`cluster.placement`)."""
    rank_nodes: dict[str, list[str]] = field(default_factory=dict)
    """expert-parallel engine id -> the Ray node id of each of its ranks."""
    ffn: dict[str, list[Any]] = field(default_factory=dict)
    """AFD engine id -> its FFN ranks' actors (`hosts.ffn`; none with compute skip)."""
    kv_store: Any = None
    """The shared KV store's actor (kv_offload.shared_gb > 0), else None."""


def _shared_actors(cfg: TestbedConfig) -> tuple[Any, Any]:
    """The actors every engine shares, each None unless configured: the fabric's link
    (kv_transfer.link_scope=fabric) and the shared KV store (kv_offload.shared_gb > 0), whose calls
    queue there."""
    fabric = (
        ray.remote(LinkQueue).options(num_cpus=0).remote() if cfg.kv_transfer.link_scope == "fabric" else None
    )
    if not cfg.kv_offload.shared_gb:
        return fabric, None
    return fabric, ray.remote(KVStore).options(num_cpus=0).remote(*kv_store_args(cfg))


def deploy(cfg: TestbedConfig, render: bool = False) -> LiveDeployment:
    """Create and start every actor (and the render pool's if `render`); emulated time zero is shortly
    after the last one is ready."""
    cfg = with_stream_flush(cfg, serving=render)
    check_resources(cfg)
    if cfg.runner.compute == "real":
        from actors.engine.runner.tiny_model import ensure_model

        ensure_model(cfg.runner)  # build once here, so actors on this node only load it
    host = ray.remote(EngineHost)
    fabric, kv_store = _shared_actors(cfg)
    pools: dict[str, dict[str, Any]] = {"mixed": {}, "prefill": {}, "decode": {}}
    placements: dict[str, EnginePlacement] = {}
    ffn: dict[str, list[Any]] = {}  # AFD: each engine's FFN ranks, made first (its warm-up calls them)
    try:
        for role, pool in cfg.pools.by_role():
            for i in range(pool.replicas):
                eid = replica_id(role, i)
                placements[eid] = engine_placement(role, pool, cfg.runner.num_gpus)
                peers = dict(pools["prefill"]) if role == "decode" else {}
                ffn[eid] = ffn_actors(cfg, pool)
                pools[role][eid] = host.options(**placements[eid].options).remote(
                    eid, role, i, cfg, pool, peers, fabric if role == "prefill" else None, ffn[eid], kv_store
                )
    except BaseException:  # what was placed is freed (a joined cluster outlives this run)
        placed = [h for per in pools.values() for h in per.values()] + ffn_handles(ffn)
        for handle in placed + ([kv_store] if kv_store is not None else []):
            ray.kill(handle)
        release(list(placements.values()))
        raise
    if cfg.kv_transfer.bidirectional:  # prefill pulls a conversation's blocks back from decode
        ray.get([h.add_peers.remote(dict(pools["decode"])) for h in pools["prefill"].values()])
    engines = {eid: h for per in pools.values() for eid, h in per.items()}
    nodes = dict(zip(engines, ray.get([h.node_id.remote() for h in engines.values()]), strict=True))
    renders: list[Any] = [
        ray.remote(RenderHost).options(num_cpus=0).remote(cfg, i)
        for i in range(cfg.render.replicas if render else 0)
    ]
    encoder_ids = [replica_id("encoder", i) for i in range(cfg.pools.encoder.replicas)]
    encoders: list[Any] = [
        ray.remote(EncoderHost).options(num_cpus=0).remote(eid, i, cfg) for i, eid in enumerate(encoder_ids)
    ]
    proxy_args = (cfg, pools, renders, encoders)
    proxy, *spares = [new_proxy(proxy_args) for _ in range(1 + len(cfg.faults.proxy_kills))]
    targets = {"proxy": ray.get(proxy.start.remote())}
    targets.update(
        {replica_id("render", i): t for i, t in enumerate(ray.get([h.start.remote() for h in renders]))}
    )
    dep = LiveDeployment(engines, nodes, proxy, 0.0, targets, renders, fabric, encoders, proxy_args, spares)
    dep.placements = placements
    dep.ffn = ffn
    dep.kv_store = kv_store
    dep.rank_nodes = {eid: rank_nodes(p) for eid, p in placements.items() if p.group is not None}
    encoder_by_id = dict(zip(encoder_ids, encoders, strict=True))
    timed = {"proxy": proxy, **engines, **encoder_by_id}
    dep.clock_offsets = {actor: measure_actor(h) for actor, h in timed.items()}
    try:
        check_uncertainty(dep.clock_offsets, cfg.clock.max_sync_uncertainty_s)
    except ConfigError:
        kill(dep)
        raise
    epoch = dep.clock_epoch_s = time.monotonic() + _START_SLACK_S
    offset = {actor: o.offset_s for actor, o in dep.clock_offsets.items()}
    encoder_targets = ray.get([h.start.remote(epoch, offset[eid]) for eid, h in encoder_by_id.items()])
    targets.update(zip(encoder_ids, encoder_targets, strict=True))
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
    on_tick: Callable[[float, LagFigures], None] | None = None,
) -> list[RequestResult]:
    """Send each request at its emulated arrival time through the proxy actor; collect every result.

    `on_tick(sim_now_s, lag)` is called about every `_TICK_WALL_S` with the engines' lag so far.
    """
    clock = Clock(cfg.clock.scale, epoch_s=dep.clock_epoch_s)

    async def submit(creq: ClientRequest) -> RequestResult:
        if dep.replacing is not None and not dep.replacing.done():
            await asyncio.shield(dep.replacing)  # a new proxy is on its way
        proxy = dep.proxy
        try:
            result: RequestResult = await proxy.submit.remote(creq)
            return result
        except ray.exceptions.RayActorError as e:  # the proxy died under it: failed, not lost
            replace_proxy(dep, cfg, proxy)
            failed = RequestResult.for_request(creq)
            failed.fail(f"the proxy died: {type(e).__name__}")
            return failed

    async def ticks() -> None:
        while on_tick is not None:
            await asyncio.sleep(_TICK_WALL_S)
            alive = {}
            for eid, h in dep.engines.items():
                with contextlib.suppress(ray.exceptions.RayActorError):
                    alive[eid] = await h.report.remote()
            on_tick(clock.now(), lag_summary(alive))

    async def strike(kind: str, actor: str, at_s: float) -> None:  # faults.engine_kills, _hangs, proxy_kills
        await clock.sleep_until(at_s)
        if kind == "engine_kills":  # the actor dies
            ray.kill(dep.engines[actor])
        elif kind == "engine_hangs":  # its step loop stops
            await dep.engines[actor].hang.remote(f"at {at_s:g} s (faults.{kind})")
        else:  # the actor dies and a new one takes its place
            dead = dep.proxy
            ray.kill(dead)
            await replace_proxy(dep, cfg, dead)

    ticker = asyncio.ensure_future(ticks())
    kinds = ("engine_kills", "engine_hangs")
    faults = [
        asyncio.ensure_future(strike(k, f.engine, f.at_s)) for k in kinds for f in getattr(cfg.faults, k)
    ]
    faults += [asyncio.ensure_future(strike("proxy_kills", "proxy", t)) for t in cfg.faults.proxy_kills]
    try:
        lead_s = _SEND_LEAD_WALL_S / cfg.clock.scale
        render_chat = chat_renderer(cfg, requests)
        tier = render_tier_for(cfg)
        return await run_workload(submit, requests, clock, cfg, tier, on_result, lead_s, render_chat)
    finally:
        for task in (ticker, *faults):
            task.cancel()


def new_proxy(args: tuple[Any, ...]) -> Any:
    """A proxy actor (`ProxyHost(*args)`), not started."""
    return ray.remote(ProxyHost).options(num_cpus=0).remote(*args)


def replace_proxy(dep: LiveDeployment, cfg: TestbedConfig, dead: Any) -> asyncio.Future[None]:
    """Replace the proxy actor `dead` (it died, or a fault killed it) by a new one, as a supervisor
    restarts a crashed proxy: its routers start empty, its /metrics is announced and its clock joined
    (its offset measured anew: it may be on another node). Requests sent meanwhile wait for it; a
    caller that finds `dead` dead after it was replaced changes nothing (`dep.replacing`)."""
    if dep.proxy is dead and (dep.replacing is None or dep.replacing.done()):
        dep.replacing = asyncio.ensure_future(_replace(dep, cfg))
    assert dep.replacing is not None
    return dep.replacing


async def _replace(dep: LiveDeployment, cfg: TestbedConfig) -> None:
    proxy = dep.spare_proxies.pop() if dep.spare_proxies else new_proxy(dep.proxy_args)
    await proxy.clock_probe.remote()  # (constructed)
    offset = dep.clock_offsets["proxy"] = measure_actor(proxy)  # (a few ms of round trips)
    dep.metrics_targets["proxy"] = await proxy.start.remote()
    write_sd_file(cfg.metrics.sd_file, cfg.design, dep.metrics_targets)
    await proxy.join_clock.remote(dep.clock_epoch_s, offset.offset_s)
    dep.proxy = proxy
    dep.num_proxy_restarts += 1


def run_live(
    cfg: TestbedConfig,
    address: str | None = None,
    requests: Workload | LoadedWorkload | None = None,
    on_result: Callable[[RequestResult], None] | None = None,
    on_tick: Callable[[float, LagFigures], None] | None = None,
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
        loaded = load_workload(cfg, requests)
        results = asyncio.run(drive(dep, cfg, loaded.workload, on_result, on_tick))
        time.sleep(cfg.metrics.linger_s)
        reports, metrics, encoder_stats = shutdown(dep, cfg)
        info: DeploymentFigures = {
            "num_proxy_restarts": dep.num_proxy_restarts,
            "clock_sync": sync_summary(dep.clock_offsets),
        }
        dep = None
        return run_output(cfg, results, reports, metrics, loaded.info, info, encoder_stats)
    finally:
        if dep is not None:
            kill(dep)
        if started:
            disconnect()
