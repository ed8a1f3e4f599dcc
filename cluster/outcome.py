"""What a run leaves behind, assembled the same way in virtual and live mode."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from emulation.config import PoolConfig, TestbedConfig
from emulation.kernel_tables import KernelTablesError, tables_for
from emulation.profiles import GPUS
from emulation.trust import Trust, trust_of
from messages import RequestResult
from messages.stats import EncoderStats, EngineReport, LostEngine
from workloads.results import results_frame
from workloads.run_summary import DeploymentFigures, EncoderFigures, MeasuredFigures, RunSummary, WorkloadInfo
from workloads.summary import fault_summary, lag_summary, moe_summary, summarize


@dataclass
class RunOutput:
    results: pd.DataFrame
    """One row per request (workloads.results)."""
    summary: RunSummary
    """The run's record: bench-serve keys, ours, lag (`workloads.run_summary`)."""
    engine_reports: Mapping[str, EngineReport | LostEngine]
    """engine id -> its report (EngineCore.report), or why it could not give one."""
    metrics: Mapping[str, str]
    """actor id (engine ids, `proxy`) -> its final Prometheus exposition."""


def run_output(
    cfg: TestbedConfig,
    results: list[RequestResult],
    reports: Mapping[str, EngineReport | LostEngine],
    metrics: Mapping[str, str],
    workload_info: WorkloadInfo | None = None,
    deployment_info: DeploymentFigures | None = None,
    encoder_stats: Sequence[EncoderStats] = (),
) -> RunOutput:
    """`workload_info`: what the workload says of itself (a trace's nominal rate, its theoretical
    prefix-hit rate), overriding `workload.rate` where it has one; `deployment_info`: what the
    deployment says of itself (proxy restarts; live: its clocks' offsets); `encoder_stats`: each
    encoder's final totals (E/P/D)."""
    info: WorkloadInfo = workload_info or {}
    rate = info.get("rate", cfg.workload.rate)
    df = results_frame(results, cfg.design, rate, cfg.seed, cfg.workload.num_warmup_requests)
    num_gpus = None if "target" in info else cfg.pools.num_gpus  # (a server's: unknown)
    serve = summarize(df, cfg.slos, num_gpus)
    summary: RunSummary = {
        "design": cfg.design,
        "rate": rate,
        **serve,
        **info,
        "time_scale": cfg.clock.time_scale,
        **lag_summary(reports),
        **fault_summary(reports),
        **moe_summary(reports),
        **encoder_summary(encoder_stats, serve["duration_s"] or 0.0),
        "cpu_overhead_share": cpu_overhead_share(reports),
        **measured_summary(cfg, reports),
    }
    if "target" not in info:  # an emulated target's figures: how far the silicon rows say to trust them
        summary["trust"] = trust_for(cfg).line
    summary.update(deployment_info or {})
    return RunOutput(df, summary, reports, metrics)


def cpu_overhead_share(reports: Mapping[str, EngineReport | LostEngine]) -> float:
    """The LM engines' CPU work over their busy time (0 before any step)."""
    counters = [r.counters for r in reports.values() if isinstance(r, EngineReport)]
    busy_s = sum(c.busy_s for c in counters)
    return sum(c.cpu_s for c in counters) / busy_s if busy_s > 0 else 0.0


def measured_summary(cfg: TestbedConfig, reports: Mapping[str, EngineReport | LostEngine]) -> MeasuredFigures:
    """`target.time_model: measured`: per engine role, the share of its GPU step time that kernels
    measured on silicon priced, and which tables (the rest: the operators roofline), with one line
    saying so (`measured_coverage`); empty for the other time models."""
    if cfg.target.time_model != "measured":
        return {}
    measured: dict[str, float] = {}
    gpu: dict[str, float] = {}
    for report in reports.values():
        if isinstance(report, EngineReport):
            c = report.counters
            measured[report.role] = measured.get(report.role, 0.0) + c.measured_s
            gpu[report.role] = gpu.get(report.role, 0.0) + c.busy_s - c.cpu_s
    shares = {role: measured[role] / gpu[role] for role in gpu if gpu[role] > 0}
    tables: dict[str, str] = {
        role: tables_line(cfg, pool) for role, pool in cfg.pools.by_role() if pool.replicas
    }
    parts = [
        f"{role} {100 * shares[role]:.0f} % ({tables[role]})" if role in shares else f"{role}: no steps"
        for role in tables
    ]
    return {
        "measured_share_by_role": shares,
        "kernel_tables_by_role": tables,
        "measured_coverage": "measured: share of step time from measured kernels: " + ", ".join(parts),
    }


def trust_for(cfg: TestbedConfig) -> Trust:
    """What the held-out silicon rows nearest `cfg`'s target say of its time model (`emulation.trust`):
    its first engine pool's GPU, its model, P/D or not."""
    role, pool = next((r, p) for r, p in cfg.pools.by_role() if p.replicas)
    return trust_of(cfg.target.time_model, GPUS[pool.gpu], cfg.target.profile, role != "mixed")


def tables_line(cfg: TestbedConfig, pool: PoolConfig) -> str:
    """Which tables priced `pool`'s steps under `measured`, in words (or why none did)."""
    if pool.afd is not None:
        return "AFD: its pipeline's rooflines"
    k = cfg.target.kernel_tables
    try:
        tables = tables_for(pool.gpu, k.backend, k.version)
    except KernelTablesError:
        return f"no {k.backend} tables for {pool.gpu}: operators roofline"
    return f"{tables.backend} {tables.version} tables, {pool.gpu}"


def encoder_summary(encoder_stats: Sequence[EncoderStats], duration_s: float) -> EncoderFigures:
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
