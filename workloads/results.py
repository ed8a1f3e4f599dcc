"""Per-request results as a table: one row per request, every timestamp in emulated seconds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from actors.messages import RequestResult, RequestTimes

_TIMES_FIELDS = [f.name for f in dataclasses.fields(RequestTimes)]


def _row(r: RequestResult) -> dict:
    """A result with the engine's times flattened into columns of their own."""
    row = {f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "times"}
    times = dataclasses.asdict(r.times) if r.times is not None else dict.fromkeys(_TIMES_FIELDS)
    return {**row, **times}


def results_frame(results: list[RequestResult], design: str, rate: float, seed: int) -> pd.DataFrame:
    df = pd.DataFrame([_row(r) for r in results], columns=[*_row(results[0])] if results else None)
    df.insert(0, "design", design)
    df.insert(1, "rate", rate)
    df.insert(2, "seed", seed)
    times = df["token_times_s"]
    first = times.map(lambda t: t[0] if len(t) else np.nan)
    last = times.map(lambda t: t[-1] if len(t) else np.nan)
    n = times.map(len)
    df["num_output_tokens"] = n
    df["ttft_s"] = first - df["arrival_s"]
    df["e2el_s"] = last - df["arrival_s"]
    df["tpot_s"] = np.where(n > 1, (last - first) / (n - 1).clip(lower=1), np.nan)
    df["max_gap_s"] = times.map(lambda t: float(np.max(np.diff(t))) if len(t) > 1 else np.nan)
    df["p99_itl_s"] = times.map(lambda t: float(np.percentile(np.diff(t), 99)) if len(t) > 1 else np.nan)
    df["handoff_s"] = df["kv_transfer_done_s"] - df["kv_transfer_start_s"]
    df["ok"] = df["finished_reason"].isin(["length", "stop"])
    return df
