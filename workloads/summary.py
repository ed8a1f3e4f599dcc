"""Summaries of a results table, with `vllm bench serve`'s result keys plus the testbed's own."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from workloads.latency import HANDOFF_PARTS
from workloads.slo import COLUMNS, Slo, parse_slo


def _ms(values: Any, q: float | None = None) -> float | None:
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return None
    return float((np.mean(arr) if q is None else np.percentile(arr, q)) * 1000.0)


def slo_met(df: pd.DataFrame, slo: Slo) -> pd.Series:
    """Per request: finished and within every bound (`Slo.met`, as the proxy's metrics count it)."""
    cols = list(COLUMNS.values())
    return pd.Series(
        [
            slo.met(bool(ok), dict(zip(cols, v, strict=True)))
            for ok, *v in df[["ok", *cols]].itertuples(False)
        ],
        index=df.index,
        dtype=bool,
    )


def summarize(df: pd.DataFrame, slos: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """One record: bench-serve keys (ms, req/s), worst gap, handoff, SLO attainment and goodput."""
    ok = df[df["ok"]]
    itls = np.concatenate([np.diff(t) for t in ok["token_times_s"] if len(t) > 1] or [np.empty(0)])
    last = ok["token_times_s"].map(lambda t: t[-1])
    duration = float(last.max() - df["arrival_s"].min()) if len(ok) else math.nan
    record: dict[str, Any] = {
        "completed": len(ok),
        "failed": int((~df["ok"]).sum()),
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration and duration > 0 else 0.0,
        "output_throughput": float(ok["num_output_tokens"].sum()) / duration if duration > 0 else 0.0,
        "mean_ttft_ms": _ms(ok["ttft_s"]),
        "median_ttft_ms": _ms(ok["ttft_s"], 50),
        "p99_ttft_ms": _ms(ok["ttft_s"], 99),
        "mean_itl_ms": _ms(itls),
        "median_itl_ms": _ms(itls, 50),
        "p99_itl_ms": _ms(itls, 99),
        "mean_tpot_ms": _ms(ok["tpot_s"]),
        "median_tpot_ms": _ms(ok["tpot_s"], 50),
        "p99_tpot_ms": _ms(ok["tpot_s"], 99),
        "median_e2el_ms": _ms(ok["e2el_s"], 50),
        "p99_e2el_ms": _ms(ok["e2el_s"], 99),
        "max_gap_ms": _ms(itls, 100),
        "median_render_ms": _ms(ok["render_s"], 50),
        "median_encode_ms": _ms(ok["encode_s"], 50),
        "median_ec_transfer_ms": _ms(ok["ec_transfer_s"], 50),
        "median_handoff_ms": _ms(ok["handoff_s"], 50),
        "p99_handoff_ms": _ms(ok["handoff_s"], 99),
        **{
            f"{q}_handoff_{part}_ms": _ms(ok[f"handoff_{part}_s"], pct)
            for part in HANDOFF_PARTS
            for q, pct in (("median", 50), ("p99", 99))
        },
        "num_preemptions": int(df["num_preemptions"].sum()),
        "prefix_hit_rate": _ratio(df["prompt_cached_tokens"].sum(), df["num_prompt_tokens"].sum()),
        "median_ttft_ms_by_turn": {
            f"{turn:g}": _ms(part["ttft_s"], 50) for turn, part in ok.groupby("turn", dropna=True)
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


def lag_summary(reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Lag over all engines: the share of steps and handoffs whose real work overran its budget."""
    live = [r for r in reports.values() if "num_steps" in r]
    events = sum(r["num_steps"] + r["num_transfers"] for r in live)
    lagged = sum(r["num_lagged_steps"] + r["num_lagged_transfers"] for r in live)
    return {
        "lag_fraction": lagged / events if events else 0.0,
        "max_overrun_ms": max((r["max_overrun_s"] for r in live), default=0.0) * 1000.0,
        "num_engines_lost": len(reports) - len(live),
    }
