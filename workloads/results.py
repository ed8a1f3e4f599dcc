"""Per-request results as a table: one row per request, every timestamp in emulated seconds."""

from __future__ import annotations

import dataclasses

import pandas as pd

from messages import RequestResult, RequestTimes
from workloads.latency import HANDOFF_PARTS, handoff_parts, request_latencies

_TIMES_FIELDS = [f.name for f in dataclasses.fields(RequestTimes)]
_PREFILL_COLUMNS = {
    "queued_s": "prefill_queued_s",
    "scheduled_s": "prefill_scheduled_s",
    "first_token_s": "prefill_first_token_s",
    "num_cached_tokens": "prefill_cached_tokens",
    "num_external_tokens": "prefill_pulled_back_tokens",
    "kv_pull_back_failed": "prefill_kv_pull_back_failed",
    "kv_bytes": "prefill_pulled_back_bytes",
    "num_preemptions": "prefill_num_preemptions",
}
"""P/D: the prefill engine's times kept beside the producing (decode) engine's."""


def _row(r: RequestResult) -> dict:
    """A result with the engines' times flattened into columns of their own."""
    row = {
        f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name not in ("times", "prefill_times")
    }
    times = dataclasses.asdict(r.times) if r.times is not None else dict.fromkeys(_TIMES_FIELDS)
    prefill = r.prefill_times
    row.update({col: getattr(prefill, f) if prefill else None for f, col in _PREFILL_COLUMNS.items()})
    decode_cached = times["num_cached_tokens"] if r.prefill_engine is not None else None
    return {**row, **times, "decode_cached_tokens": decode_cached}


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
    parts = [handoff_parts(r.prefill_done_s, r.times) for r in results]
    for part in HANDOFF_PARTS:
        df[f"handoff_{part}_s"] = [p[part] if p else float("nan") for p in parts]
    df["ok"] = df["finished_reason"].isin(["length", "stop"])
    # Where the prompt was computed (prefill in P/D), how much of it the prefix cache served.
    df["prompt_cached_tokens"] = df["prefill_cached_tokens"].fillna(df["num_cached_tokens"]).fillna(0)
    # The prompt tokens computed where the prompt was computed: not cached there, nor pulled back.
    pulled = df["prefill_pulled_back_tokens"].fillna(0)
    df["prompt_computed_tokens"] = df["num_prompt_tokens"] - df["prompt_cached_tokens"] - pulled
    return df
