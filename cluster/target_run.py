"""Composition root for `testbed replay --target URL`: the trace's sessions against a server outside
the testbed, on a wall clock; what comes back is a run's output without engines (client-side times)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx

from actors.engine.clock import Clock
from cluster.config_load import ConfigError
from cluster.outcome import RunOutput, run_output
from emulation.config import TestbedConfig
from messages import RequestResult
from workloads.openai_target import OpenAITarget
from workloads.replay import LoadedWorkload, load_workload, run_workload
from workloads.run_summary import WorkloadInfo


def _served_model(url: str, api_key: str | None) -> str:
    """The first model the server lists (`/v1/models`)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(f"{url.rstrip('/')}/v1/models", headers=headers, timeout=30)
        resp.raise_for_status()
        return str(resp.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise ConfigError(
            f"--target={url}: no model listed at /v1/models ({type(e).__name__}: {e})"
        ) from None


def run_against_target(
    cfg: TestbedConfig,
    url: str,
    model: str | None = None,
    api_key: str | None = None,
    on_result: Callable[[RequestResult], None] | None = None,
    requests: LoadedWorkload | None = None,
) -> RunOutput:
    """Replay `cfg`'s workload (or `requests`, loaded already) against the server at `url` (its first
    listed model unless `model`)."""
    loaded = load_workload(cfg, requests)
    model = model or _served_model(url, api_key)

    async def main() -> list[RequestResult]:
        clock = Clock(1.0, epoch_s=time.monotonic())
        target = OpenAITarget(url, model, clock.now, api_key)
        try:
            # The server renders chat prompts itself: nothing to render here.
            return await run_workload(
                target.submit, loaded.workload, clock, cfg, None, on_result, render_chat=lambda _: []
            )
        finally:
            await target.close()

    results = asyncio.run(main())
    info: WorkloadInfo = {**loaded.info, "target": url, "model": model}
    return run_output(cfg, results, {}, {}, info)
