"""The proxy's actor body (`ProxyHost`) and its client (`RemoteProxy`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from actors.engine.clock import Clock
from actors.engine_pool import watch_health
from actors.proxy import Proxy
from actors.render.client import render_again
from cluster.clock_sync import Probe, probe
from cluster.engines import encoder_pool
from cluster.hosts.common import remote_stream, serve_node_metrics
from cluster.hosts.encoder import RemoteEncoder
from cluster.hosts.engine import RemoteEngine
from cluster.hosts.render import actor_render
from dashboards.recorders import ProxyMetrics
from emulation.config import TestbedConfig
from messages import (
    ClientRequest,
    EngineOutput,
    RequestResult,
)


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
            async for item in remote_stream(self._handle.stream, creq):
                if isinstance(item, RequestResult):  # its figures too, computed once in the proxy
                    vars(result).update(vars(item))
                else:
                    yield item
        except Exception as e:  # the proxy actor died: the request failed, it is not lost
            result.fail(f"{type(e).__name__}: {e}")
        finally:
            result.end_stream()
