"""What a run leaves behind, assembled the same way in virtual and live mode."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from emulation.config import TestbedConfig
from messages import RequestResult
from messages.stats import EncoderStats, EngineReport, LostEngine
from workloads.results import results_frame
from workloads.summary import fault_summary, lag_summary, moe_summary, summarize


@dataclass
class RunOutput:
    results: pd.DataFrame
    """One row per request (workloads.results)."""
    summary: dict[str, Any]
    """The run's record: bench-serve keys, ours, lag."""
    engine_reports: Mapping[str, EngineReport | LostEngine]
    """engine id -> its report (EngineCore.report), or why it could not give one."""
    metrics: Mapping[str, str]
    """actor id (engine ids, `proxy`) -> its final Prometheus exposition."""


def run_output(
    cfg: TestbedConfig,
    results: list[RequestResult],
    reports: Mapping[str, EngineReport | LostEngine],
    metrics: Mapping[str, str],
    workload_info: dict[str, Any] | None = None,
    deployment_info: dict[str, Any] | None = None,
    encoder_stats: Sequence[EncoderStats] = (),
) -> RunOutput:
    """`workload_info`: what the workload says of itself (a trace's nominal rate, its theoretical
    prefix-hit rate), overriding `workload.rate` where it has one; `deployment_info`: what the
    deployment says of itself (proxy restarts; live: its clocks' offsets); `encoder_stats`: each
    encoder's final totals (E/P/D)."""
    info = workload_info or {}
    rate = info.get("rate", cfg.workload.rate)
    df = results_frame(results, cfg.design, rate, cfg.seed, cfg.workload.num_warmup_requests)
    num_gpus = None if "target" in info else cfg.pools.num_gpus  # (a server's: unknown)
    summary = {
        "design": cfg.design,
        "rate": rate,
        **summarize(df, cfg.slos, num_gpus),
        **info,
        "time_scale": cfg.clock.time_scale,
        **lag_summary(reports),
        **fault_summary(reports),
        **moe_summary(reports),
    }
    summary.update(encoder_summary(encoder_stats, summary.get("duration_s") or 0.0))
    summary["cpu_overhead_share"] = cpu_overhead_share(reports)
    summary.update(deployment_info or {})
    return RunOutput(df, summary, reports, metrics)


def cpu_overhead_share(reports: Mapping[str, EngineReport | LostEngine]) -> float:
    """The LM engines' CPU work over their busy time (0 before any step)."""
    counters = [r.counters for r in reports.values() if isinstance(r, EngineReport)]
    busy_s = sum(c.busy_s for c in counters)
    return sum(c.cpu_s for c in counters) / busy_s if busy_s > 0 else 0.0


def encoder_summary(encoder_stats: Sequence[EncoderStats], duration_s: float) -> dict[str, float]:
    """E/P/D: the encoder pool's busy share of the run and its cache's hit rate, from the encoders'
    final totals (nothing without an encoder pool)."""
    if not encoder_stats or duration_s <= 0:
        return {}
    busy_s = sum(s.busy_s for s in encoder_stats)
    queries = sum(s.num_mm_cache_queries for s in encoder_stats)
    hits = sum(s.num_mm_cache_hits for s in encoder_stats)
    return {
        "encoder_busy_fraction": busy_s / (duration_s * len(encoder_stats)),
        "encoder_cache_hit_rate": hits / queries if queries else 0.0,
    }


def write_json(path: Path, data: Any) -> None:
    """`data` as strict JSON: every figure finite or null (NaN, and ±inf: a rate of inf, every request
    at t = 0 as `vllm bench serve --request-rate inf` sends them, is null here and inf in memory)."""
    loose = json.dumps(clean_json(data))  # NaN and ±inf as JavaScript's constants, read back as null
    strict = json.loads(loose, parse_constant=lambda _: None)
    path.write_text(json.dumps(strict, indent=2, allow_nan=False) + "\n")


def clean_json(obj: Any) -> Any:
    """NaN -> None, recursively, so JSON stays strict."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, EngineReport | LostEngine):
        return clean_json(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {k: clean_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean_json(v) for v in obj]
    return obj
