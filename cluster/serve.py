"""Composition root for `testbed serve`: one design behind an OpenAI-compatible HTTP server.

Two ways to place the roles, one front end and one HTTP app for both:

    in process (default)   HTTP + front end + render pool + proxy + engines on one event loop
    on Ray (--ray)         HTTP + front end here; render pool, proxy and engines as Ray actors, deployed
                           as a live run deploys them (a local Ray, or --address to join one)

Either way on a real-time clock (`clock.time_scale` wall seconds per emulated second), so clients see
emulated TTFT and ITL. On shutdown every request's row is written to `--out` (results.parquet,
summary.json, the resolved config and the final metrics), like a run, before the check that no request,
block or render stream was left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from fastapi import FastAPI

from actors.api.frontend import Frontend, ProxyClient
from actors.api.server import build_app
from actors.engine.clock import Clock
from actors.engine.core import EngineCore
from actors.render.client import RenderClient, local_render, render_again, render_for
from actors.render.render import Render
from cluster.interrupt import Interrupted
from cluster.virtual import build_deployment
from dashboards.exposition import merged_exposition, merged_text_expositions, write_sd_file
from dashboards.recorders import RenderMetrics
from emulation.config import TestbedConfig


@dataclass
class Served:
    app: FastAPI
    frontend: Frontend
    engines: list[EngineCore]
    """In-process engines (none on Ray)."""
    deployment: Any = None
    """On Ray: the live deployment (actor handles)."""
    render_replicas: list[Render] = field(default_factory=list)
    """In-process render replicas (none on Ray)."""


class _InProcess:
    """Every role in this process, on the server's event loop (engines compute off it)."""

    def __init__(self, cfg: TestbedConfig) -> None:
        self.clock = Clock(cfg.clock.scale, epoch_s=time.monotonic())
        render_metrics = [RenderMetrics(cfg, i) for i in range(cfg.render.replicas)]
        self.render_replicas = [render_for(cfg, m.on_render) for m in render_metrics]
        self.renders: list[RenderClient] = [local_render(r) for r in self.render_replicas]
        self.dep = build_deployment(
            cfg, self.clock, compute_in_thread=True, render=render_again(self.renders)
        )
        self.proxy: ProxyClient = self.dep.proxy
        self.engines = self.dep.engines
        assert self.dep.proxy_metrics is not None
        self._registries = [m.registry for m in [*self.dep.engine_metrics, self.dep.proxy_metrics]]
        self._registries += [m.registry for m in self.dep.encoder_metrics]
        self._registries += [m.registry for m in render_metrics]

    async def metrics_text(self) -> str:
        return merged_exposition(self._registries)

    async def start(self) -> None:
        self.dep.start()

    async def stop(self) -> str:
        """Stop the engines, release KV nobody will pull; the final metrics."""
        with contextlib.suppress(Exception):  # an engine that crashed: its requests already failed
            await self.dep.drain()
        return merged_exposition(self._registries)

    def assert_empty(self) -> None:
        self.dep.assert_empty()
        for r in self.render_replicas:
            r.assert_empty()


class _OnRay:
    """Every role a Ray actor; this process serves HTTP and runs the front end."""

    def __init__(self, cfg: TestbedConfig, address: str | None) -> None:
        from cluster.hosts import RemoteProxy, actor_render
        from cluster.live import deploy
        from cluster.ray_connect import connect, disconnect

        self.cfg = cfg
        self._started = connect([cfg], address)
        try:
            self.dep = deploy(cfg, render=True)
        except BaseException:
            if self._started:
                disconnect()
            raise
        self.clock = Clock(cfg.clock.scale, epoch_s=self.dep.clock_epoch_s)
        self.proxy: ProxyClient = RemoteProxy(self.dep.proxy)
        self.renders: list[RenderClient] = [actor_render(h) for h in self.dep.renders]
        self.engines: list[EngineCore] = []
        self._error: Exception | None = None

    def _handles(self) -> list[Any]:
        return [self.dep.proxy, *self.dep.engines.values(), *self.dep.renders]

    async def metrics_text(self) -> str:
        """Every actor's exposition merged (each also serves its own, announced for Prometheus)."""
        return merged_text_expositions(await asyncio.gather(*[h.metrics.remote() for h in self._handles()]))

    async def start(self) -> None:
        await self.clock.sleep_until(0.0)  # emulated time zero: every actor started

    async def stop(self) -> str:
        """Drain every actor (each checks it is empty) and stop the Ray started here; the final metrics."""
        from cluster.live import shutdown
        from cluster.ray_connect import disconnect

        metrics: dict[str, str] = {}
        try:
            _, metrics, _ = await asyncio.to_thread(shutdown, self.dep, self.cfg)
        except Exception as e:  # a leak found by a drain: raised after the results are written
            self._error = e
        if self._started:
            disconnect()
        return merged_text_expositions(list(metrics.values()))

    def assert_empty(self) -> None:
        if self._error is not None:
            raise self._error


def build_server(
    cfg: TestbedConfig,
    out: Path | None = None,
    api_key: str | None = None,
    max_body_bytes: int = 4 * 1024**2,
    on_ray: bool = False,
    address: str | None = None,
    keep_results: bool = True,
) -> Served:
    """The app, its front end and its roles (on Ray if `on_ray`: a local Ray, or the one at `address`);
    the roles start with the app (lifespan) and are checked empty at its end. `keep_results`: keep
    every request's row (for `out` and tests; ~10 KB per 128-token answer, until the end)."""
    cfg = dataclasses.replace(cfg, clock=dataclasses.replace(cfg.clock, mode="live"))
    if on_ray:
        from cluster.live import with_stream_flush

        cfg = with_stream_flush(cfg, serving=True)
    roles = _OnRay(cfg, address) if on_ray else _InProcess(cfg)
    frontend = Frontend(
        cfg,
        proxy=roles.proxy,
        renders=roles.renders,
        clock=roles.clock,
        answers=render_for(cfg),
        keep_results=keep_results,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await roles.start()
        yield
        metrics = await roles.stop()
        if out is not None:
            write_results(out, cfg, frontend, metrics)
        roles.assert_empty()

    app = build_app(frontend, roles.metrics_text, api_key, max_body_bytes)
    app.router.lifespan_context = lifespan
    if isinstance(roles, _OnRay):
        return Served(app, frontend, roles.engines, roles.dep)
    return Served(app, frontend, roles.engines, render_replicas=roles.render_replicas)


def write_results(out: Path, cfg: TestbedConfig, frontend: Frontend, metrics: str) -> None:
    """What a run leaves behind, for the requests this server answered."""
    from cluster.config_load import dump_config
    from cluster.outcome import write_json
    from workloads.results import results_frame
    from workloads.summary import summarize

    out.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, out / "config.yaml")
    (out / "metrics.prom").write_text(metrics)
    if frontend.results:
        df = results_frame(frontend.results, cfg.design, 0.0, cfg.seed)
        df.to_parquet(out / "results.parquet", index=False)
        write_json(out / "summary.json", summarize(df, cfg.slos))


def serve(
    cfg: TestbedConfig,
    host: str,
    port: int,
    out: Path | None,
    api_key: str | None,
    max_body_bytes: int,
    on_ray: bool = False,
    address: str | None = None,
) -> NoReturn:
    """Serve until Ctrl-C (or SIGTERM), then raise `Interrupted` with the requests answered and where
    they are written (`out`; None: KeyboardInterrupt)."""
    import uvicorn

    served = build_server(cfg, out, api_key, max_body_bytes, on_ray, address, keep_results=out is not None)
    name = cfg.target.served_model_name or cfg.target.model
    where = "roles on Ray" if on_ray else "roles in this process"
    print(f"serving {cfg.design} as model {name!r} on http://{host}:{port}/v1, {where} (Ctrl-C stops)")
    # Announce /metrics to a Prometheus started by `testbed dashboards up` (a file of its own, so a live
    # run's targets are not touched); withdrawn when the server stops. On Ray each actor is announced
    # instead (as in a live run): scraping the merged endpoint too would count every series twice.
    sd_file = serve_sd_file(cfg.metrics.sd_file)
    if not on_ray:
        target = f"{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
        write_sd_file(sd_file, cfg.design, {"serve": target})
    try:  # until Ctrl-C (or SIGTERM): uvicorn shuts down gracefully, and its lifespan writes `out`
        with contextlib.suppress(KeyboardInterrupt):
            uvicorn.run(served.app, host=host, port=port, log_level="warning")
    finally:
        write_sd_file(sd_file, cfg.design, {})
    if out is None:
        raise KeyboardInterrupt
    raise Interrupted(len(served.frontend.results), None, out)


def serve_sd_file(sd_file: str) -> str:
    """`testbed serve`'s file-SD target list beside a live run's (the scrape config globs for both)."""
    path = Path(sd_file)
    return str(path.with_name(f"{path.stem}-serve{path.suffix}"))
