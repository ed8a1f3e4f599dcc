"""Actor bodies (`*Host`: what runs inside a Ray actor) and the clients that make an actor look like the
plain role to its callers (`Remote*`). Roles stay plain classes; Ray appears only here and in `live.py`.

    front end ──RemoteProxy──► ProxyHost(Proxy) ──RemoteEngine──► EngineHost(EngineCore)
        │                           ├──RemoteEncoder (E/P/D: images first)──► EncoderHost(EncoderCore)
        │                           └──actor_render (re-render for decode)──┐
        └──actor_render (render per request, derender per batch)──► RenderHost(Render)

Streams cross actors as Ray streaming generators of batches; closing a client's stream early cancels
the actor's (an asyncio cancel in an async actor), which aborts the request there.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import ray

from actors.encoder.encoder import EncoderCore
from actors.engine.clock import Clock
from actors.engine.core import EngineCore, Role
from actors.engine.health import EngineDeadError
from actors.engine.kv_connector_worker import KVSource
from actors.engine_pool import watch_health
from actors.proxy import Proxy
from actors.render.client import METHODS, RenderClient, render_again, render_for
from cluster.clock_sync import Probe, probe
from cluster.engines import build_encoder, build_engine, encoder_pool, runner_for
from dashboards.exposition import serve_metrics
from dashboards.recorders import EncoderMetrics, EngineMetrics, ProxyMetrics, RenderMetrics
from emulation.config import PoolConfig, TestbedConfig
from messages import (
    ClientRequest,
    EncodedImage,
    EncodeJob,
    EngineOutput,
    EngineRequest,
    KVPayload,
    KVPull,
    KVTransferParams,
    RequestResult,
)
from messages.stats import EncoderStats, EngineReport


async def _remote_stream(method: Any, *args: Any) -> AsyncGenerator[Any, None]:
    """The items of a streaming actor method; the actor's task is cancelled if the consumer stops early."""
    gen = method.options(num_returns="streaming").remote(*args)
    done = False
    try:
        async for ref in gen:
            yield await ref
        done = True
    finally:
        if not done:
            ray.cancel(gen)


class RemoteEngine:
    """An engine actor seen as a plain engine: the proxy's EngineClient and a decode's KVSource."""

    def __init__(self, engine_id: str, handle: Any) -> None:
        self.engine_id = engine_id
        self._handle = handle

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        with self._dead_as_engine_dead():
            async for out in _remote_stream(self._handle.generate, request):
                yield out

    async def get_kv(self, pull: KVPull) -> KVPayload:
        with self._dead_as_engine_dead():
            payload: KVPayload = await self._handle.get_kv.remote(pull)
        return payload

    async def free_kv(self, request_id: str) -> None:
        await self._handle.free_kv.remote(request_id)

    async def check_health(self) -> None:
        with self._dead_as_engine_dead():
            await self._handle.check_health.remote()

    async def kv_ready(self, request_id: str, kv_transfer_params: KVTransferParams) -> None:
        with self._dead_as_engine_dead():
            await self._handle.kv_ready.remote(request_id, kv_transfer_params)

    @contextlib.contextmanager
    def _dead_as_engine_dead(self) -> Iterator[None]:
        """A dead actor's error as the engine's own (`EngineDeadError`): the proxy retries a prefill
        elsewhere and stops routing to it, as in virtual mode."""
        try:
            yield
        except ray.exceptions.RayActorError as e:
            raise EngineDeadError(f"engine {self.engine_id} died: {type(e).__name__}") from e


class RemoteLink:
    """The shared link's actor (kv_transfer.link_scope=fabric) seen as a `Link`: one call per transfer."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    async def reserve(self, start_s: float, wire_s: float) -> float:
        wire_start_s: float = await self._handle.reserve.remote(start_s, wire_s)
        return wire_start_s


class EngineHost:
    """The body of an engine actor: builds the runner at construction, the engine on the actor's loop."""

    def __init__(
        self,
        engine_id: str,
        role: Role,
        replica: int,
        cfg: TestbedConfig,
        pool: PoolConfig,
        prefill: dict[str, Any],
        link: Any = None,
    ) -> None:
        """`prefill`: the prefill engines' actors by id (a decode engine's peers); `link`: the shared
        link's actor a prefill engine sends on (kv_transfer.link_scope=fabric), None: its own."""
        self._args = (engine_id, role, cfg, pool)
        self._link = RemoteLink(link) if link is not None else None
        self._flush_s = cfg.clock.stream_flush_wall_s
        assert self._flush_s is not None  # resolved by live.deploy
        self._prefill = prefill
        self._runner = runner_for(cfg, pool)
        if self._runner is not None:
            self._runner.warm_up()
        self._metrics = EngineMetrics(cfg, role, replica)
        self.engine: EngineCore | None = None

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def add_peers(self, engines: dict[str, Any]) -> None:
        """More engines this one pulls from (bidirectional: a prefill engine pulls back from decode
        engines, which exist only after it); call before `start`."""
        self._prefill.update(engines)

    def clock_probe(self) -> Probe:
        return probe()

    async def start(self, epoch_s: float, offset_s: float) -> str:
        """Start the engine on the shared clock (`offset_s`: this process's monotonic clock less the
        head's) and its /metrics endpoint; returns `host:port` of it."""
        engine_id, role, cfg, pool = self._args
        peers: dict[str, KVSource] = {eid: RemoteEngine(eid, h) for eid, h in self._prefill.items()}
        clock = Clock(cfg.clock.scale, epoch_s=epoch_s, offset_s=offset_s)
        self.engine = build_engine(
            engine_id, role, cfg, pool, clock, self._runner, peers, self._metrics, True, self._link
        )
        self.engine.start()
        return serve_node_metrics(self._metrics.registry)

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        assert self.engine is not None
        async for out in self.engine.generate(request):
            yield out
            if out.finished_reason is None and self._flush_s:
                await asyncio.sleep(self._flush_s)

    async def get_kv(self, pull: KVPull) -> KVPayload:
        assert self.engine is not None
        return await self.engine.get_kv(pull)

    async def free_kv(self, request_id: str) -> None:
        assert self.engine is not None
        await self.engine.free_kv(request_id)

    async def kv_ready(self, request_id: str, kv_transfer_params: KVTransferParams) -> None:
        assert self.engine is not None
        await self.engine.kv_ready(request_id, kv_transfer_params)

    async def report(self) -> EngineReport:
        assert self.engine is not None
        return self.engine.report()

    async def check_health(self) -> None:
        assert self.engine is not None
        await self.engine.check_health()

    async def hang(self, why: str) -> None:
        assert self.engine is not None
        self.engine.inject("hang", why)

    async def metrics(self) -> str:
        return self._metrics.exposition()

    async def drain(self) -> EngineReport:
        """Stop the step loop, release KV nobody will pull, check nothing is left; the final report."""
        assert self.engine is not None
        await self.engine.drain()
        self.engine.assert_empty()
        return self.engine.report()


class EncoderHost:
    """The body of an encoder actor (E/P/D): the encoder on the actor's loop, from `start`."""

    def __init__(self, encoder_id: str, replica: int, cfg: TestbedConfig) -> None:
        self._args = (encoder_id, cfg)
        self._metrics = EncoderMetrics(cfg, replica)
        self.encoder: EncoderCore | None = None

    def clock_probe(self) -> Probe:
        return probe()

    def start(self, epoch_s: float, offset_s: float) -> str:
        """Start the encoder on the shared clock and its /metrics endpoint; returns `host:port` of it."""
        encoder_id, cfg = self._args
        clock = Clock(cfg.clock.scale, epoch_s=epoch_s, offset_s=offset_s)
        self.encoder = build_encoder(encoder_id, cfg, clock, True, self._metrics)
        self.encoder.start()
        return serve_node_metrics(self._metrics.registry)

    def metrics(self) -> str:
        return self._metrics.exposition()

    async def encode(self, job: EncodeJob) -> EncodedImage:
        assert self.encoder is not None
        return await self.encoder.encode(job)

    async def drain(self) -> EncoderStats:
        """Stop the step loop, check nothing is left; the encoder's final totals."""
        assert self.encoder is not None
        await self.encoder.drain()
        self.encoder.assert_empty()
        return self.encoder.stats()


class RemoteEncoder:
    """An encoder actor, as the proxy's encoder pool calls it."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    async def encode(self, job: EncodeJob) -> EncodedImage:
        done: EncodedImage = await self._handle.encode.remote(job)
        return done


class ProxyHost:
    """The body of the proxy actor; `renders`: render actors, to render a prompt again for decode;
    `encoders`: the encoder actors (E/P/D)."""

    def __init__(
        self, cfg: TestbedConfig, pools: dict[str, dict[str, Any]], renders: list[Any], encoders: list[Any]
    ) -> None:
        remote = {
            role: [RemoteEngine(eid, h) for eid, h in engines.items()] for role, engines in pools.items()
        }
        self._metrics = ProxyMetrics(cfg)
        render = render_again([actor_render(h) for h in renders]) if renders else None
        push = cfg.kv_transfer.mode == "push"
        self._time_scale = cfg.clock.scale
        self._health_check_interval_s = cfg.router.health_check_interval_s
        self._health: asyncio.Future[None] | None = None
        self._proxy = Proxy(
            mixed=remote["mixed"],
            prefill=remote["prefill"],
            decode=remote["decode"],
            recorder=self._metrics,
            render=render,
            push=push,
            router=cfg.router,
            block_size=cfg.scheduler.block_size,
            bidirectional=cfg.kv_transfer.bidirectional,
            encoders=encoder_pool(cfg, [RemoteEncoder(h) for h in encoders]),
        )

    async def submit(self, creq: ClientRequest) -> RequestResult:
        return await self._proxy.submit(creq)

    async def stream(self, creq: ClientRequest) -> AsyncGenerator[EngineOutput | RequestResult, None]:
        """The client's token batches as they come, then the request's result (see `RemoteProxy`)."""
        result = RequestResult.for_request(creq)
        async for out in self._proxy.stream(creq, result):
            yield out
        yield result

    def start(self) -> str:
        """Serve /metrics; returns its `host:port`."""
        return serve_node_metrics(self._metrics.registry)

    def clock_probe(self) -> Probe:
        return probe()

    async def join_clock(self, epoch_s: float, offset_s: float) -> None:
        """The run's clock, so that a re-render for decode is on the emulated path; the engines' health
        checks start on it (`router.health_check_interval_s`)."""
        clock = self._proxy.clock = Clock(self._time_scale, epoch_s=epoch_s, offset_s=offset_s)
        if self._health_check_interval_s is not None:
            watch = watch_health(self._proxy.pools, clock, self._health_check_interval_s, None)
            self._health = asyncio.ensure_future(watch)

    def metrics(self) -> str:
        return self._metrics.exposition()


class RemoteProxy:
    """The proxy actor seen as the front end's proxy: batches stream back; its result fills `result`."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    async def stream(self, creq: ClientRequest, result: RequestResult) -> AsyncGenerator[EngineOutput, None]:
        try:
            async for item in _remote_stream(self._handle.stream, creq):
                if isinstance(item, RequestResult):
                    for f in dataclasses.fields(item):
                        setattr(result, f.name, getattr(item, f.name))
                else:
                    yield item
        except Exception as e:  # the proxy actor died: the request failed, it is not lost
            result.finished_reason = "error"
            result.error = f"{type(e).__name__}: {e}"
        finally:
            if result.finished_reason is None:
                result.finished_reason = "abort"
                result.error = "the client closed the stream"


class RenderHost:
    """The body of a render actor: one replica of the render pool (a sync actor: one call at a time, so
    renders queue on a busy replica as on a real render process)."""

    def __init__(self, cfg: TestbedConfig, replica: int) -> None:
        self._metrics = RenderMetrics(cfg, replica)
        self.render = render_for(cfg, self._metrics.on_render)

    def start(self) -> str:
        """Serve /metrics; returns its `host:port`."""
        return serve_node_metrics(self._metrics.registry)

    def call(self, method: str, *args: Any) -> Any:
        """`Render.<method>(*args)` on this replica (what `actor_render` clients send)."""
        if method not in METHODS:
            raise ValueError(
                f"render: {method!r} is not a render call; allowed: {', '.join(sorted(METHODS))}"
            )
        return getattr(self.render, method)(*args)

    def metrics(self) -> str:
        return self._metrics.exposition()

    def drain(self) -> None:
        """Check no stream is left open."""
        self.render.assert_empty()


def actor_render(handle: Any) -> RenderClient:
    """A client of a render actor (`RenderHost`); `close` is told, not awaited."""

    async def call(method: str, *args: Any) -> Any:
        return await handle.call.remote(method, *args)

    return RenderClient(call, lambda method, *args: handle.call.remote(method, *args))


def serve_node_metrics(registry: Any) -> str:
    """Serve `registry` at /metrics on this node's address and a free port (scraped via file SD)."""
    host = ray.util.get_node_ip_address()
    return f"{host}:{serve_metrics(registry, host)}"
