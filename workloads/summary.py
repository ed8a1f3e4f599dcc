"""Summaries of a run, with `vllm bench serve`'s result keys plus the testbed's own: of its results table
(latencies, SLOs, what each handoff moved, where prompt tokens came from) and of its engines' reports
(lag, faults, a MoE target's steps). `cluster.outcome.run_output` assembles them for `testbed run`,
`replay` and every point of a sweep alike; the report's tables and plots read the same figures."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any, cast

import numpy as np
import pandas as pd

from messages import OFFLOAD_TIERS
from messages.latency import HANDOFF_PARTS
from messages.stats import EngineReport, LostEngine
from workloads.latency import gaps, percentiles
from workloads.run_summary import (
    FaultFigures,
    HandoffBytes,
    HandoffFigures,
    LagFigures,
    MoeFigures,
    ServeFigures,
    SloFigures,
)
from workloads.slo_targets import TermCount, parse_slo_target


def _finite(values: Any) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    return arr[~np.isnan(arr)]


def _mean_ms(values: Any) -> float | None:
    """The mean of `values` but NaNs, in ms; None if none is left."""
    arr = _finite(values)
    return float(np.mean(arr) * 1000.0) if arr.size else None


def _percentiles_ms(values: Any, *qs: float) -> list[float | None]:
    """The `qs`-th percentiles of `values` but NaNs, in ms (None if none is left): numpy's, bit for
    bit (`latency.percentiles`)."""
    arr = _finite(values)
    if not arr.size:
        return [None] * len(qs)
    return [v * 1000.0 for v in percentiles(arr, qs)]


def measured(df: pd.DataFrame) -> pd.DataFrame:
    """The rows every figure counts: the results less their warm-up requests (the `warmup` column,
    `workload.num_warmup_requests`; a table written before warm-ups has no such column)."""
    if "warmup" in df and df["warmup"].any():
        return df[~df["warmup"]]
    return df


def summarize(
    df: pd.DataFrame, slos: tuple[str, ...] | list[str], num_gpus: int | None = None
) -> ServeFigures:
    """One record: bench-serve keys (ms, req/s, tok/s), worst gap, handoff, and per SLO set
    (`slo_figures`) attainment, goodput and what decides whether it holds. Warm-up requests (the
    results' `warmup` column, `workload.num_warmup_requests`) are left out (`measured`).
    `num_gpus`: the deployment's GPUs (`PoolsConfig.num_gpus`), for `output_throughput_per_gpu` (None:
    not a deployment of the testbed's, so none)."""
    df = measured(df)
    ok = df[df["ok"]]
    rejected = df["finished_reason"] == "rejected"
    itls = gaps([t for t in ok["token_times_s"] if len(t) > 1])
    last = ok["token_times_s"].map(lambda t: t[-1])
    duration = float(last.max() - df["arrival_s"].min()) if len(ok) else math.nan
    ttft, itl, tpot = ok["ttft_s"], itls, ok["tpot_s"]
    median_ttft, p99_ttft = _percentiles_ms(ttft, 50, 99)
    median_itl, p99_itl, max_gap = _percentiles_ms(itl, 50, 99, 100)
    median_tpot, p99_tpot = _percentiles_ms(tpot, 50, 99)
    median_e2el, p99_e2el = _percentiles_ms(ok["e2el_s"], 50, 99)
    median_handoff, p99_handoff = _percentiles_ms(ok["handoff_s"], 50, 99)
    output_throughput = output_tps(ok, duration)
    handoff_parts = {
        key: v
        for part in HANDOFF_PARTS
        for key, v in zip(
            (f"median_handoff_{part}_ms", f"p99_handoff_{part}_ms"),
            _percentiles_ms(ok[f"handoff_{part}_s"], 50, 99),
            strict=True,
        )
    }
    record: ServeFigures = {
        "completed": len(ok),
        "failed": int((~df["ok"] & ~rejected).sum()),
        "rejected": int(rejected.sum()),  # completed + failed + rejected: every request sent but warm-ups
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration and duration > 0 else 0.0,
        "output_throughput": output_throughput,
        "num_gpus": num_gpus,
        "output_throughput_per_gpu": output_throughput / num_gpus if num_gpus else None,
        "mean_ttft_ms": _mean_ms(ttft),
        "median_ttft_ms": median_ttft,
        "p99_ttft_ms": p99_ttft,
        "mean_itl_ms": _mean_ms(itl),
        "median_itl_ms": median_itl,
        "p99_itl_ms": p99_itl,
        "mean_tpot_ms": _mean_ms(tpot),
        "median_tpot_ms": median_tpot,
        "p99_tpot_ms": p99_tpot,
        "median_e2el_ms": median_e2el,
        "p99_e2el_ms": p99_e2el,
        "max_gap_ms": max_gap,
        "median_render_ms": _percentiles_ms(ok["render_s"], 50)[0],
        "median_encode_ms": _percentiles_ms(ok["encode_s"], 50)[0],
        "median_ec_transfer_ms": _percentiles_ms(ok["ec_transfer_s"], 50)[0],
        "median_handoff_ms": median_handoff,
        "p99_handoff_ms": p99_handoff,
        **cast(HandoffFigures, handoff_parts),  # (its keys, as a test checks)
        "num_preemptions": int(df["num_preemptions"].sum()),
        "num_prefill_retries": int(df["num_prefill_retries"].sum()),
        "num_prefill_timeouts": int(df["num_prefill_timeouts"].sum()),
        "prefix_hit_rate": _ratio(df["prompt_cached_tokens"].sum(), df["num_prompt_tokens"].sum()),
        "prompt_token_share_by_source": prompt_token_shares(ok),
        **handoff_bytes(handoffs(df)),
        "median_ttft_ms_by_turn": {
            f"{turn:g}": _percentiles_ms(part["ttft_s"], 50)[0]
            for turn, part in ok.groupby("turn", dropna=True)
        },
        **slo_figures(df, slos, duration),
    }
    return record


def output_tps(ok: pd.DataFrame, duration_s: float) -> float:
    """Output tokens a second of the successful requests `ok` over `duration_s` (vLLM's
    `output_throughput`; 0 without a duration)."""
    return float(ok["num_output_tokens"].sum()) / duration_s if duration_s > 0 else 0.0


def slo_figures(df: pd.DataFrame, slos: Sequence[str], duration_s: float) -> SloFigures:
    """Per SLO set (by name): `slo_attainment`, the share of requests within every bound on their own;
    `goodput`, those requests a second; and `slo_term_counts`, each term's `TermCount` (as JSON), which
    say whether the set holds over the run's requests (`slo_verdicts`)."""
    figures: SloFigures = {"slo_attainment": {}, "goodput": {}, "slo_term_counts": {}}
    for text in slos:
        target = parse_slo_target(text)
        met = target.within_every_bound(df)
        figures["slo_attainment"][target.name] = float(met.mean()) if len(met) else 0.0
        figures["goodput"][target.name] = float(met.sum()) / duration_s if duration_s > 0 else 0.0
        counts = target.counts(df)
        figures["slo_term_counts"][target.name] = {term: asdict(c) for term, c in counts.items()}
    return figures


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den else 0.0


PROMPT_SOURCES = ("gpu", *OFFLOAD_TIERS, "pulled_back", "computed")
"""Where a prompt's tokens came from, where it was computed (prefill in P/D): the GPU prefix cache, each
offload tier (`OFFLOAD_TIERS`), a pull back from decode (bidirectional KV), or computed."""


def prompt_token_shares(ok: pd.DataFrame) -> dict[str, float]:
    """The successful requests' prompt tokens by `PROMPT_SOURCES`, as shares of all of them (they add
    up to 1; all 0 without a prompt token)."""
    tiers = {tier: float(ok[f"prompt_{tier}_tokens"].sum()) for tier in OFFLOAD_TIERS}
    tokens = {
        "gpu": float(ok["prompt_cached_tokens"].sum()) - sum(tiers.values()),
        **tiers,
        "pulled_back": float(ok["prefill_pulled_back_tokens"].fillna(0).sum()),
        "computed": float(ok["prompt_computed_tokens"].sum()),
    }
    total = sum(tokens.values())
    return {source: _ratio(tokens[source], total) for source in PROMPT_SOURCES}


def handoffs(results: pd.DataFrame) -> pd.DataFrame:
    """The successful requests whose prompt's KV (or state) was handed from prefill to decode, their
    `kv_bytes` and `state_bytes` filled (0: none, as a table written before states moved)."""
    ok = results.loc[results["ok"]].assign(state_bytes=results.get("state_bytes", 0))
    ok = ok.fillna({"kv_bytes": 0, "state_bytes": 0})
    return ok[ok["kv_bytes"] + ok["state_bytes"] > 0]


def handoff_bytes(moved: pd.DataFrame) -> HandoffBytes:
    """What `moved` (`handoffs`) moved: how many, each one's mean attention KV and SSM state (a hybrid
    target's; 0 for another's) in bytes, and the state's share of all the bytes (None without a
    handoff)."""
    kv, state = float(moved["kv_bytes"].sum()), float(moved["state_bytes"].sum())
    n = len(moved)
    return {
        "num_handoffs": n,
        "mean_kv_bytes_per_handoff": kv / n if n else None,
        "mean_state_bytes_per_handoff": state / n if n else None,
        "state_share_of_handoff_bytes": state / (kv + state) if kv + state > 0 else None,
    }


AFD_FIGURES = (
    "a2f_bytes",
    "f2a_bytes",
    "afd_exposed_s",
    "attention_bubble_s",
    "ffn_bubble_s",
    "ffn_utilization",
)
"""An AFD engine's step figures (`messages.moe_steps.MoeWork`'s), all 0 for another's."""


def moe_means(log: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """A MoE step log's figures (`messages.moe_steps.MoeSteps`, or engines.json's form of it) as means
    per step (a point weighs its steps), its steps, and the seconds dual-batch overlap hid."""
    n = np.asarray(log["num_steps"], dtype=float)

    def mean(key: str) -> float:
        return float(np.dot(log[key], n) / n.sum())

    return {
        "num_steps": float(n.sum()),
        "num_tokens": mean("num_tokens"),
        "max_tokens_per_expert": mean("max_tokens_per_expert"),
        "mean_tokens_per_expert": mean("mean_tokens_per_expert"),
        "imbalance": mean("imbalance"),
        "all_to_all_s": mean("all_to_all_s"),
        "dbo_hidden_s": float(np.dot(log["overlap_s"], n)),
        **{key: mean(key) for key in AFD_FIGURES},
    }


def moe_summary(reports: Mapping[str, EngineReport | LostEngine]) -> MoeFigures:
    """A MoE target's steps per engine role (`mixed`, `prefill`, `decode`): `moe_means` of all its
    engines' step logs together (each step weighs the same, whichever engine took it); empty for a
    dense target."""
    logs: dict[str, dict[str, list[float]]] = {}
    for report in reports.values():
        if isinstance(report, EngineReport) and report.moe_steps and report.moe_steps.num_steps:
            merged = logs.setdefault(report.role, {})
            for key, values in asdict(report.moe_steps).items():
                merged.setdefault(key, []).extend(values)
    return {"moe_steps_by_role": {role: moe_means(log) for role, log in logs.items()}}


def mean_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Average records of the same design and rate over seeds (None where no seed had a value)."""
    mean = _mean_over_seeds(records)
    assert isinstance(mean, dict)
    return mean


def _mean_over_seeds(values: list[Any]) -> Any:
    """The seeds' numbers averaged (None where none had one), dicts key by key at any depth (per-turn
    keys differ by seed), anything else the first seed's."""
    first = values[0]
    if isinstance(first, dict):
        keys = dict.fromkeys(k for v in values for k in v)
        return {k: _mean_over_seeds([v[k] for v in values if k in v]) for k in keys}
    if isinstance(first, int | float) or first is None:
        numbers = [v for v in values if v is not None]
        return float(np.mean(numbers)) if numbers else None
    return first


def slo_verdicts(record: Mapping[str, Any]) -> dict[str, bool]:
    """Per SLO set of a summary record: whether it holds over the record's requests (`SloTarget.holds`:
    every term's percentile within its bound, failed requests infinitely late). A sweep's record holds
    the means over its `num_seeds` seeds: those counts times it are their sums, every seed's requests
    judged together (as `testbed plan` pools seeds)."""
    num_seeds = record.get("num_seeds") or 1
    verdicts = {}
    for name, counts in record.get("slo_term_counts", {}).items():
        pooled = {
            term: TermCount(**{k: round(v * num_seeds) for k, v in c.items()}) for term, c in counts.items()
        }
        verdicts[name] = parse_slo_target(name).holds(pooled)
    return verdicts


def sweep_goodput(records: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per design and SLO set: the highest offered rate at which the set holds (`slo_verdicts`); None
    where it holds at none."""
    out: dict[str, dict[str, float | None]] = {}
    for r in records:
        per_slo = out.setdefault(r["design"], {})
        for slo, holds in slo_verdicts(r).items():
            best = per_slo.get(slo)
            if holds and (best is None or r["rate"] > best):
                per_slo[slo] = r["rate"]
            else:
                per_slo.setdefault(slo, None)
    return out


def fault_summary(reports: Mapping[str, EngineReport | LostEngine]) -> FaultFigures:
    """Faults over all engines: KV loads that failed (injected on purpose among them) and those whose
    request computed the KV instead; engines hung on purpose."""
    reported = [r for r in reports.values() if isinstance(r, EngineReport)]
    counters = [r.counters for r in reported]
    return {
        "num_failed_loads": sum(c.num_failed_loads for c in counters),
        "num_injected_load_failures": sum(c.num_injected_load_failures for c in counters),
        "num_recomputed_loads": sum(c.num_recomputed_loads for c in counters),
        "num_engines_hung": sum(r.hung is not None for r in reported),
    }


def lag_summary(reports: Mapping[str, EngineReport | LostEngine]) -> LagFigures:
    """Lag over all engines: the share of steps and handoffs whose real work overran its budget."""
    counters = [r.counters for r in reports.values() if isinstance(r, EngineReport)]
    events = sum(c.num_steps + c.num_transfers for c in counters)
    lagged = sum(c.num_lagged_steps + c.num_lagged_transfers for c in counters)
    return {
        "lag_fraction": lagged / events if events else 0.0,
        "max_overrun_ms": max((c.max_overrun_s for c in counters), default=0.0) * 1000.0,
        # killed, crashed or unreachable
        "num_engines_lost": sum(r.error is not None for r in reports.values()),
    }
