"""Ending a live deployment: drained (`shutdown`: every actor's report and final metrics first) or at
once (`kill`: after a failure); either way every actor is killed and every placement released."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import ray

from cluster.placement import release
from dashboards.exposition import write_sd_file
from emulation.config import TestbedConfig, replica_id
from messages.stats import EncoderStats, EngineReport, LostEngine

if TYPE_CHECKING:
    from cluster.live import LiveDeployment


def shutdown(
    dep: LiveDeployment, cfg: TestbedConfig
) -> tuple[dict[str, EngineReport | LostEngine], dict[str, str], list[EncoderStats]]:
    """Drain every live engine (dead ones are skipped), render replica and encoder (checked empty),
    collect every actor's final metrics, kill all actors and withdraw their scrape targets; engine
    reports and expositions by actor id, and the encoders' final totals."""
    reports: dict[str, EngineReport | LostEngine] = {}
    metrics: dict[str, str] = {}
    encoder_stats: list[EncoderStats] = []
    lost = (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError)
    for eid, handle in dep.engines.items():
        try:
            reports[eid] = ray.get(handle.drain.remote(), timeout=60)
            metrics[eid] = ray.get(handle.metrics.remote(), timeout=60)
        except lost as e:
            reports[eid] = LostEngine(f"{type(e).__name__}: not drained")
    with contextlib.suppress(*lost):
        metrics["proxy"] = ray.get(dep.proxy.metrics.remote(), timeout=60)
    for i, handle in enumerate(dep.renders):
        with contextlib.suppress(*lost):
            ray.get(handle.drain.remote(), timeout=60)
            metrics[replica_id("render", i)] = ray.get(handle.metrics.remote(), timeout=60)
    for i, handle in enumerate(dep.encoders):
        with contextlib.suppress(*lost):
            stats = ray.get(handle.drain.remote(), timeout=60)
            metrics[replica_id("encoder", i)] = ray.get(handle.metrics.remote(), timeout=60)
            encoder_stats.append(stats)
    kill(dep)
    write_sd_file(cfg.metrics.sd_file, cfg.design, {})
    return reports, metrics, encoder_stats


def kill(dep: LiveDeployment) -> None:
    for handle in [
        *dep.engines.values(),
        dep.proxy,
        *dep.spare_proxies,
        *dep.renders,
        *dep.encoders,
        *([dep.link] if dep.link else []),
        *([dep.kv_store] if dep.kv_store else []),
        *ffn_handles(dep.ffn),
    ]:
        ray.kill(handle)
    release(list(dep.placements.values()))


def ffn_handles(ffn: dict[str, list[Any]]) -> list[Any]:
    """Every AFD engine's FFN rank actors."""
    return [h for handles in ffn.values() for h in handles]
