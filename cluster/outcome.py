"""What a run leaves behind, assembled the same way in virtual and live mode."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from messages import RequestResult
from target.config import TestbedConfig
from workloads.results import results_frame
from workloads.summary import lag_summary, summarize


@dataclass
class RunOutput:
    results: pd.DataFrame
    """One row per request (workloads.results)."""
    summary: dict[str, Any]
    """The run's record: bench-serve keys, ours, lag."""
    engine_reports: dict[str, dict[str, Any]]
    """engine id -> its counters (EngineCore.report)."""
    metrics: dict[str, str]
    """actor id (engine ids, `proxy`) -> its final Prometheus exposition."""


def run_output(
    cfg: TestbedConfig,
    results: list[RequestResult],
    reports: dict[str, dict[str, Any]],
    metrics: dict[str, str],
    workload_info: dict[str, Any] | None = None,
) -> RunOutput:
    """`workload_info`: what the workload says of itself (a trace's nominal rate, its theoretical
    prefix-hit rate), overriding `workload.rate` where it has one."""
    info = workload_info or {}
    rate = info.get("rate", cfg.workload.rate)
    df = results_frame(results, cfg.design, rate, cfg.seed)
    summary = {
        "design": cfg.design,
        "rate": rate,
        **summarize(df, cfg.slos),
        **info,
        "time_scale": cfg.clock.time_scale,
        **lag_summary(reports),
    }
    return RunOutput(df, summary, reports, metrics)


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(clean_json(data), indent=2, allow_nan=False) + "\n")


def clean_json(obj: Any) -> Any:
    """NaN -> None, recursively, so JSON stays strict."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: clean_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean_json(v) for v in obj]
    return obj
