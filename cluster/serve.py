"""Composition root for `testbed serve`: one design behind an OpenAI-compatible HTTP server.

All roles run in this process on the server's event loop, on a real-time clock (`clock.time_scale`
wall seconds per emulated second): the render pool, the proxy and the engines (computing off the loop),
so clients see emulated TTFT and ITL. On shutdown every request's row is written to `--out`
(results.parquet, summary.json, the resolved config and the final metrics), like a run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI

from actors.api.frontend import Frontend
from actors.api.server import build_app
from actors.engine.clock import Clock
from actors.engine.core import EngineCore
from actors.messages import RenderSpec
from actors.render.render import Render
from actors.render.tokenizer import load_tokenizer
from cluster.config import TestbedConfig
from cluster.virtual import build_deployment
from dashboards.exposition import merged_exposition, write_sd_file
from dashboards.recorders import RenderMetrics


@dataclass
class Served:
    app: FastAPI
    frontend: Frontend
    engines: list[EngineCore]


def build_server(
    cfg: TestbedConfig, out: Path | None = None, api_key: str | None = None, max_body_bytes: int = 4 * 1024**2
) -> Served:
    """The app, its front end and engines; engines start with the app (lifespan) and are checked empty
    at its end."""
    cfg = dataclasses.replace(cfg, clock=dataclasses.replace(cfg.clock, mode="live"))
    clock = Clock(cfg.clock.scale, epoch_s=time.time())
    tokenizer = load_tokenizer(cfg.render.tokenizer_path, cfg.runner.vocab_size)
    template = Path(cfg.render.chat_template_path).read_text() if cfg.render.chat_template_path else None
    render_metrics = [RenderMetrics(cfg, i) for i in range(cfg.render.replicas)]
    renders = [Render(tokenizer, template, on_render=m.on_render) for m in render_metrics]

    async def rerender(spec: RenderSpec) -> list[int]:  # the proxy renders through the front end's pool
        return await frontend.render(spec)

    dep = build_deployment(cfg, clock, compute_in_thread=True, render=rerender)
    frontend = Frontend(cfg, dep.proxy, renders, clock)
    assert dep.proxy.metrics is not None
    registries = [e.metrics.registry for e in dep.engines] + [dep.proxy.metrics.registry]
    registries += [m.registry for m in render_metrics]

    def metrics_text() -> str:
        return merged_exposition(registries)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        tasks = [asyncio.ensure_future(e.run()) for e in dep.engines]
        yield
        for e in dep.engines:
            e.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        for e in dep.engines:
            e.expire_held(float("inf"))
        if out is not None:
            write_results(out, cfg, frontend, metrics_text())
        for e in dep.engines:
            e.assert_empty()
        frontend.assert_empty()

    app = build_app(frontend, metrics_text, api_key, max_body_bytes)
    app.router.lifespan_context = lifespan
    return Served(app, frontend, dep.engines)


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
    cfg: TestbedConfig, host: str, port: int, out: Path | None, api_key: str | None, max_body_bytes: int
) -> None:
    import uvicorn

    app = build_server(cfg, out, api_key, max_body_bytes).app
    # Announce /metrics to a Prometheus started by `testbed dashboards up` (a file of its own, so a live
    # run's targets are not touched); withdrawn when the server stops.
    sd_file = serve_sd_file(cfg.metrics.sd_file)
    write_sd_file(sd_file, cfg.design, {"serve": f"{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"})
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        write_sd_file(sd_file, cfg.design, {})


def serve_sd_file(sd_file: str) -> str:
    """`testbed serve`'s file-SD target list beside a live run's (the scrape config globs for both)."""
    path = Path(sd_file)
    return str(path.with_name(f"{path.stem}-serve{path.suffix}"))
