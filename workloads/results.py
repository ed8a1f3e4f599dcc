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


def request_latencies(arrival_s: float, token_times_s: list[float]) -> dict[str, float]:
    """One request's client-side latencies (NaN where undefined): the results table's columns, and what
    the proxy's metrics record, so both always agree."""
    n = len(token_times_s)
    nan = float("nan")
    if n == 0:
        return {"ttft_s": nan, "e2el_s": nan, "tpot_s": nan, "max_gap_s": nan, "p99_itl_s": nan}
    first, last = token_times_s[0], token_times_s[-1]
    gaps = np.diff(token_times_s)
    return {
        "ttft_s": first - arrival_s,
        "e2el_s": last - arrival_s,
        "tpot_s": (last - first) / (n - 1) if n > 1 else nan,
        "max_gap_s": float(gaps.max()) if n > 1 else nan,
        "p99_itl_s": float(np.percentile(gaps, 99)) if n > 1 else nan,
    }


def results_frame(results: list[RequestResult], design: str, rate: float, seed: int) -> pd.DataFrame:
    df = pd.DataFrame([_row(r) for r in results], columns=[*_row(results[0])] if results else None)
    df.insert(0, "design", design)
    df.insert(1, "rate", rate)
    df.insert(2, "seed", seed)
    df["num_output_tokens"] = df["token_times_s"].map(len)
    lat = [request_latencies(a, t) for a, t in zip(df["arrival_s"], df["token_times_s"], strict=True)]
    for col in ("ttft_s", "e2el_s", "tpot_s", "max_gap_s", "p99_itl_s"):
        df[col] = [x[col] for x in lat] if lat else pd.Series(dtype=float)
    df["handoff_s"] = df["kv_transfer_done_s"] - df["kv_transfer_start_s"]
    df["ok"] = df["finished_reason"].isin(["length", "stop"])
    return df
