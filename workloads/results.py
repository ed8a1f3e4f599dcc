"""Per-request results as a table: one row per request, every timestamp in emulated seconds."""

from __future__ import annotations

import dataclasses
import operator
import typing
from typing import Any

import numpy as np
import pandas as pd

from messages import OFFLOAD_TIERS, RequestResult, RequestTimes
from messages.latency import HANDOFF_PARTS, LATENCY_COLUMNS


def _columns(record: type, path: str = "") -> dict[str, str]:
    """A record's fields as columns, those of its records inlined, an engine's times left out (they
    have columns of their own): column -> its attribute path."""
    out: dict[str, str] = {}
    hints = typing.get_type_hints(record)
    for f in dataclasses.fields(record):
        if dataclasses.is_dataclass(hints[f.name]):
            out |= _columns(hints[f.name], f"{path}{f.name}.")
        elif hints[f.name] != RequestTimes | None:
            out[f.name] = path + f.name
    return out


_TIMES_COLUMNS = _columns(RequestTimes)
"""The engines' times, one column each (a record's fields under their own names)."""
_PREFILL_COLUMNS = {
    "queued_s": "prefill_queued_s",
    "scheduled_s": "prefill_scheduled_s",
    "first_token_s": "prefill_first_token_s",
    "num_cached_tokens": "prefill_cached_tokens",
    "num_external_tokens": "prefill_pulled_back_tokens",
    "kv_pull_back_failed": "prefill_kv_pull_back_failed",
    "kv_bytes": "prefill_pulled_back_bytes",
    "num_preemptions": "prefill_num_preemptions",
    "num_host_tokens": "prefill_host_tokens",
    "num_disk_tokens": "prefill_disk_tokens",
    "num_shared_tokens": "prefill_shared_tokens",
}
"""P/D: the prefill engine's times kept beside the producing (decode) engine's."""


_RESULT_COLUMNS = _columns(RequestResult)
"""A result's own columns, ahead of the engines' times."""


def results_frame(
    results: list[RequestResult], design: str, rate: float, seed: int, num_warmup_requests: int = 0
) -> pd.DataFrame:
    """One row per result, the engines' times flattened into columns of their own (built column by
    column: a frame from per-row dicts costs several times more). `warmup`: True for the first
    `num_warmup_requests` sent (`warmup_mask`; `workload.num_warmup_requests`), which the summary leaves
    out."""
    n = len(results)
    cols: dict[str, Any] = {"design": [design] * n, "rate": [rate] * n, "seed": [seed] * n}
    for name, path in _RESULT_COLUMNS.items():
        get = operator.attrgetter(path)
        cols[name] = [get(r) for r in results]
    prefill = [r.prefill.prefill_times for r in results]
    for name, col in _PREFILL_COLUMNS.items():
        get = operator.attrgetter(_TIMES_COLUMNS[name])
        cols[col] = [get(t) if t else None for t in prefill]
    times = [r.times for r in results]
    for name, path in _TIMES_COLUMNS.items():
        get = operator.attrgetter(path)
        cols[name] = [get(t) if t is not None else None for t in times]
    cols["decode_cached_tokens"] = [
        c if r.prefill.prefill_engine is not None else None
        for c, r in zip(cols["num_cached_tokens"], results, strict=True)
    ]
    cols["num_output_tokens"] = [  # a server's own count where it gave one (replay --target)
        n if n is not None else len(t)
        for n, t in zip(cols["server_num_output_tokens"], cols["token_times_s"], strict=True)
    ]
    latencies = [r.latencies for r in results]
    for col in LATENCY_COLUMNS:
        cols[col] = [lat[col] for lat in latencies]
    df = pd.DataFrame(cols)
    df["handoff_s"] = df["kv_transfer_done_s"] - df["kv_transfer_start_s"]
    parts = [r.handoff_parts for r in results]
    handoff = {f"handoff_{part}_s": [p[part] if p else float("nan") for p in parts] for part in HANDOFF_PARTS}
    df = pd.concat([df, pd.DataFrame(handoff, index=df.index)], axis=1)
    df["ok"] = df["finished_reason"].isin(["length", "stop"])
    df["warmup"] = warmup_mask(df["arrival_s"], num_warmup_requests)
    # Where the prompt was computed (prefill in P/D), how much of it each offload tier and the caches
    # altogether (GPU prefix cache, then the tiers) served.
    for tier in OFFLOAD_TIERS:
        df[f"prompt_{tier}_tokens"] = df[f"prefill_{tier}_tokens"].fillna(df[f"num_{tier}_tokens"]).fillna(0)
    df["prompt_offloaded_tokens"] = df[[f"prompt_{tier}_tokens" for tier in OFFLOAD_TIERS]].sum(axis=1)
    cached = df["prefill_cached_tokens"].fillna(df["num_cached_tokens"])
    server_cached = df["server_num_cached_tokens"].astype("float64")  # None where no server gave one
    df["prompt_cached_tokens"] = cached.fillna(server_cached).fillna(0) + df["prompt_offloaded_tokens"]
    # The prompt tokens computed where the prompt was computed: not cached there, nor pulled back.
    pulled = df["prefill_pulled_back_tokens"].fillna(0)
    df["prompt_computed_tokens"] = df["num_prompt_tokens"] - df["prompt_cached_tokens"] - pulled
    return df


def warmup_mask(arrival_s: pd.Series, num_warmup_requests: int) -> np.ndarray:
    """True for the first `num_warmup_requests` requests sent: the earliest arrivals, ties in the
    results' order (a closed loop's first slots all send at 0, in the order the results keep)."""
    mask = np.zeros(len(arrival_s), dtype=bool)
    first = np.argsort(arrival_s.to_numpy(dtype=float), kind="stable")[:num_warmup_requests]
    mask[first] = True
    return mask
