"""Actor bodies (`*Host`: what runs inside a Ray actor) and the clients that make an actor look like the
plain role to its callers (`Remote*`). Roles stay plain classes; Ray appears only here and in `live.py`.

    front end ──RemoteProxy──► ProxyHost(Proxy) ──RemoteEngine──► EngineHost(EngineCore)
        │                           └──RemoteRender (re-render for decode)──┐
        └──RemoteRender (render per request, derender per batch)──► RenderHost(Render)

Streams cross actors as Ray streaming generators of batches; closing a client's stream early cancels
the actor's (an asyncio cancel in an async actor), which aborts the request there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import AsyncGenerator
from typing import Any

import ray

from actors.engine.clock import Clock
from actors.engine.core import EngineCore, KVSource, Role, runner_for
from actors.messages import ClientRequest, EngineOutput, EngineRequest, KVPayload, RenderSpec, RequestResult
from actors.proxy import Proxy
from actors.render.client import render_again, render_for
from actors.render.parsers import ParsedDelta
from cluster.config import PoolConfig, TestbedConfig
from dashboards.exposition import serve_metrics
from dashboards.recorders import ProxyMetrics, RenderMetrics


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
        async for out in _remote_stream(self._handle.generate, request):
            yield out

    async def get_kv(self, request_id: str) -> KVPayload:
        payload: KVPayload = await self._handle.get_kv.remote(request_id)
        return payload

    async def free_kv(self, request_id: str) -> None:
        await self._handle.free_kv.remote(request_id)


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
    ) -> None:
        self._args = (engine_id, role, replica, cfg, pool)
        self._flush_s = cfg.clock.stream_flush_wall_s
        assert self._flush_s is not None  # resolved by live.deploy
        self._prefill = prefill
        self._runner = runner_for(cfg, pool)
        if self._runner is not None:
            self._runner.warm_up()
        self.engine: EngineCore | None = None
        self._task: asyncio.Future[None] | None = None

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    async def start(self, epoch_s: float) -> str:
        """Start the engine on the shared clock and its /metrics endpoint; returns `host:port` of it."""
        engine_id, role, replica, cfg, pool = self._args
        peers: dict[str, KVSource] = {eid: RemoteEngine(eid, h) for eid, h in self._prefill.items()}
        clock = Clock(cfg.clock.scale, epoch_s=epoch_s)
        self.engine = EngineCore(
            engine_id, role, cfg, pool, clock, self._runner, peers, compute_in_thread=True, replica=replica
        )
        self._task = asyncio.ensure_future(self.engine.run())
        return serve_node_metrics(self.engine.metrics.registry)

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        assert self.engine is not None
        async for out in self.engine.generate(request):
            yield out
            if out.finished_reason is None and self._flush_s:
                await asyncio.sleep(self._flush_s)

    async def get_kv(self, request_id: str) -> KVPayload:
        assert self.engine is not None
        return await self.engine.get_kv(request_id)

    async def free_kv(self, request_id: str) -> None:
        assert self.engine is not None
        await self.engine.free_kv(request_id)

    async def report(self) -> dict[str, Any]:
        assert self.engine is not None
        return self.engine.report()

    async def metrics(self) -> str:
        assert self.engine is not None
        return self.engine.metrics.exposition()

    async def drain(self) -> dict[str, Any]:
        """Stop the step loop, release KV nobody will pull, check nothing is left; the final report."""
        assert self.engine is not None and self._task is not None
        self.engine.stop()
        await self._task
        self.engine.expire_held(math.inf)
        self.engine.assert_empty()
        return self.engine.report()


class ProxyHost:
    """The body of the proxy actor; `renders`: render actors, to render a prompt again for decode."""

    def __init__(self, cfg: TestbedConfig, pools: dict[str, dict[str, Any]], renders: list[Any]) -> None:
        remote = {
            role: [RemoteEngine(eid, h) for eid, h in engines.items()] for role, engines in pools.items()
        }
        self._metrics = ProxyMetrics(cfg)
        render = render_again([RemoteRender(h) for h in renders]) if renders else None
        self._proxy = Proxy(remote["mixed"], remote["prefill"], remote["decode"], self._metrics, render)

    async def submit(self, creq: ClientRequest) -> RequestResult:
        return await self._proxy.submit(creq)

    async def stream(self, creq: ClientRequest) -> AsyncGenerator[EngineOutput | RequestResult, None]:
        """The client's token batches as they come, then the request's result (see `RemoteProxy`)."""
        result = Proxy.new_result(creq)
        async for out in self._proxy.stream(creq, result):
            yield out
        yield result

    def start(self) -> str:
        """Serve /metrics; returns its `host:port`."""
        return serve_node_metrics(self._metrics.registry)

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
            result.finished_reason, result.error = "error", f"{type(e).__name__}: {e}"
        finally:
            if result.finished_reason is None:
                result.finished_reason, result.error = "abort", "the client closed the stream"


class RenderHost:
    """The body of a render actor: one replica of the render pool (a sync actor: one call at a time, so
    renders queue on a busy replica as on a real render process)."""

    def __init__(self, cfg: TestbedConfig, replica: int) -> None:
        self._metrics = RenderMetrics(cfg, replica)
        self.render = render_for(cfg, self._metrics.on_render)

    def start(self) -> str:
        """Serve /metrics; returns its `host:port`."""
        return serve_node_metrics(self._metrics.registry)

    def render_chat(self, spec: RenderSpec) -> list[int]:
        return self.render.render_spec(spec)

    def render_text(self, text: str) -> list[int]:
        return self.render.render_text(text)

    def derender(
        self, stream_id: str, new_token_ids: list[int], finished: bool, parse: bool
    ) -> list[ParsedDelta]:
        return self.render.derender(stream_id, new_token_ids, finished, parse)

    def derender_stateless(
        self, all_token_ids: list[int], num_done: int, finished: bool, parse: bool
    ) -> list[ParsedDelta]:
        return self.render.derender_stateless(all_token_ids, num_done, finished, parse)

    def detokenize(self, token_ids: list[int]) -> str:
        return self.render.detokenize(token_ids)

    def close(self, stream_id: str) -> None:
        self.render.close(stream_id)

    def metrics(self) -> str:
        return self._metrics.exposition()

    def drain(self) -> None:
        """Check no stream is left open."""
        self.render.assert_empty()


class RemoteRender:
    """A render actor seen as a render replica (`actors.render.client.RenderClient`)."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    async def render_chat(self, spec: RenderSpec) -> list[int]:
        ids: list[int] = await self._handle.render_chat.remote(spec)
        return ids

    async def render_text(self, text: str) -> list[int]:
        ids: list[int] = await self._handle.render_text.remote(text)
        return ids

    async def derender(
        self, stream_id: str, new_token_ids: list[int], finished: bool, parse: bool = True
    ) -> list[ParsedDelta]:
        deltas: list[ParsedDelta] = await self._handle.derender.remote(
            stream_id, new_token_ids, finished, parse
        )
        return deltas

    async def derender_stateless(
        self, all_token_ids: list[int], num_done: int, finished: bool, parse: bool = True
    ) -> list[ParsedDelta]:
        deltas: list[ParsedDelta] = await self._handle.derender_stateless.remote(
            all_token_ids, num_done, finished, parse
        )
        return deltas

    async def detokenize(self, token_ids: list[int]) -> str:
        text: str = await self._handle.detokenize.remote(token_ids)
        return text

    def close(self, stream_id: str) -> None:
        self._handle.close.remote(stream_id)


def serve_node_metrics(registry: Any) -> str:
    """Serve `registry` at /metrics on this node's address and a free port (scraped via file SD)."""
    host = ray.util.get_node_ip_address()
    return f"{host}:{serve_metrics(registry, host)}"
