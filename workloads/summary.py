"""Summaries of a results table, with `vllm bench serve`'s result keys plus the testbed's own."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from messages.latency import HANDOFF_PARTS
from messages.stats import EngineReport, LostEngine
from workloads.latency import flat_stamps, percentiles
from workloads.slo import COLUMNS, Slo, parse_slo


def gaps(token_times: list[list[float]]) -> np.ndarray:
    """Every request's inter-token gaps, request after request: one difference over all the stamps,
    less those across two requests (numpy per request costs more than the arithmetic)."""
    if not token_times:
        return np.empty(0)
    lengths = [len(t) for t in token_times]
    flat = flat_stamps(token_times, lengths)
    return np.delete(np.diff(flat), np.cumsum(lengths)[:-1] - 1)


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


def slo_met(df: pd.DataFrame, slo: Slo) -> pd.Series:
    """Per request: finished and within every bound (`Slo.met`, as the proxy's metrics count it)."""
    cols = list(COLUMNS.values())
    rows = zip(df["ok"].tolist(), *(df[c].tolist() for c in cols), strict=True)  # cheaper than itertuples
    return pd.Series(
        [slo.met(bool(ok), dict(zip(cols, v, strict=True))) for ok, *v in rows],
        index=df.index,
        dtype=bool,
    )


def summarize(df: pd.DataFrame, slos: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """One record: bench-serve keys (ms, req/s), worst gap, handoff, SLO attainment and goodput."""
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
    record: dict[str, Any] = {
        "completed": len(ok),
        "failed": int((~df["ok"] & ~rejected).sum()),
        "rejected": int(rejected.sum()),  # completed + failed + rejected: every request sent
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration and duration > 0 else 0.0,
        "output_throughput": float(ok["num_output_tokens"].sum()) / duration if duration > 0 else 0.0,
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
        **{
            f"{q}_handoff_{part}_ms": v
            for part in HANDOFF_PARTS
            for q, v in zip(("median", "p99"), _percentiles_ms(ok[f"handoff_{part}_s"], 50, 99), strict=True)
        },
        "num_preemptions": int(df["num_preemptions"].sum()),
        "num_prefill_retries": int(df["num_prefill_retries"].sum()),
        "num_prefill_timeouts": int(df["num_prefill_timeouts"].sum()),
        "prefix_hit_rate": _ratio(df["prompt_cached_tokens"].sum(), df["num_prompt_tokens"].sum()),
        "median_ttft_ms_by_turn": {
            f"{turn:g}": _percentiles_ms(part["ttft_s"], 50)[0]
            for turn, part in ok.groupby("turn", dropna=True)
        },
        "slo_attainment": {},
        "goodput": {},
    }
    for text in slos:
        slo = parse_slo(text)
        met = slo_met(df, slo)
        record["slo_attainment"][slo.name] = float(met.mean()) if len(df) else 0.0
        record["goodput"][slo.name] = float(met.sum()) / duration if duration > 0 else 0.0
    return record


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den else 0.0


def mean_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Average records of the same design and rate over seeds (None where no seed had a value)."""
    out: dict[str, Any] = {}
    for key, first in records[0].items():
        if isinstance(first, dict):
            keys = dict.fromkeys(k for r in records for k in r[key])  # per-turn keys differ by seed
            out[key] = {k: float(np.mean([r[key][k] for r in records if k in r[key]])) for k in keys}
        elif isinstance(first, int | float) or first is None:
            vals = [r[key] for r in records if r[key] is not None]
            out[key] = float(np.mean(vals)) if vals else None
        else:
            out[key] = first
    return out


def sweep_goodput(
    records: list[dict[str, Any]], threshold: float = 0.9
) -> dict[str, dict[str, float | None]]:
    """Per design and SLO set: the highest offered rate whose attainment is >= threshold."""
    out: dict[str, dict[str, float | None]] = {}
    for r in records:
        per_slo = out.setdefault(r["design"], {})
        for slo, attained in r["slo_attainment"].items():
            best = per_slo.get(slo)
            if attained >= threshold and (best is None or r["rate"] > best):
                per_slo[slo] = r["rate"]
            else:
                per_slo.setdefault(slo, None)
    return out


def fault_summary(reports: Mapping[str, EngineReport | LostEngine]) -> dict[str, int]:
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


def lag_summary(reports: Mapping[str, EngineReport | LostEngine]) -> dict[str, Any]:
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
