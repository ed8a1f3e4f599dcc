"""A finished request's latencies (client side, and its KV handoff itemised): computed once per request
by `RequestResult.latencies` / `.handoff_parts` and read by the proxy's metrics, the results table and
the SLO checks (plain Python and numpy only: the proxy actor computes them on its hot path and must not
import pandas midway through a run)."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from messages import RequestTimes

LATENCY_COLUMNS = ("ttft_s", "e2el_s", "tpot_s", "max_gap_s", "p99_itl_s")
"""A request's client-side latencies (`request_latencies`), as the results table names its columns."""


def request_latencies(arrival_s: float, token_times_s: Sequence[float]) -> dict[str, float]:
    """One request's client-side latencies (NaN where undefined), keyed by `LATENCY_COLUMNS`. Plain
    Python (numpy's per-call overhead outweighs its loops at a few hundred tokens)."""
    n = len(token_times_s)
    if n == 0:
        return dict.fromkeys(LATENCY_COLUMNS, math.nan)
    first_s = token_times_s[0]
    last_s = token_times_s[n - 1]
    if n < 2:
        max_gap_s = p99_itl_s = math.nan
    else:
        gaps = sorted(map(operator.sub, token_times_s[1:], token_times_s[:-1]))  # b - a, at C speed
        max_gap_s = gaps[-1]
        p99_itl_s = percentile(gaps, 99.0)
    return {
        "ttft_s": first_s - arrival_s,
        "e2el_s": last_s - arrival_s,
        "tpot_s": (last_s - first_s) / (n - 1) if n > 1 else math.nan,
        "max_gap_s": max_gap_s,
        "p99_itl_s": p99_itl_s,
    }


def percentile(sorted_values: Sequence[float] | np.ndarray, q: float) -> float:
    """`numpy.percentile(values, q)` (its default, linear interpolation), bit for bit, of values
    sorted (or partitioned at `neighbours`): the rank q/100·(n-1) between its two neighbours."""
    lo, hi, t = neighbours(len(sorted_values), q)
    a = sorted_values[lo]
    b = sorted_values[hi]
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t  # numpy's lerp, from the nearer end


def neighbours(n: int, q: float) -> tuple[int, int, float]:
    """The q-th percentile of n sorted values lies between positions lo and hi, `t` of the way."""
    rank = q / 100 * (n - 1)
    lo = math.floor(rank)
    return lo, min(lo + 1, n - 1), rank - lo


HANDOFF_PARTS = ("proxy_hop", "admission_wait", "link_queue", "wire", "fixed", "notice_wait", "first_step")
"""A P/D request's path from prefill's token to decode's first one, in order::

    prefill done ─ proxy hop ─ decode queued ─ admission wait ─ blocks, start ─ link queue ─ wire start
    (push: decode was queued first; the hop is 0 and the wait runs from prefill done)
      ─ wire ─ (bytes sent) ─ fixed (latency + per-transfer/per-block costs, net of layer-wise overlap)
      ─ done ─ notice wait (next step boundary) ─ noticed ─ first step ─ first token

The parts add up to decode's first token minus prefill's: TTFT minus the prefill part."""


def handoff_parts(prefill_done_s: float | None, times: RequestTimes | None) -> dict[str, float] | None:
    """The handoff of a P/D request in parts (emulated seconds), None unless it reached decode's first
    token after a transfer."""
    if prefill_done_s is None or times is None:
        return None
    t, h = times, times.handoff
    marks = (h.kv_transfer_start_s, h.kv_wire_start_s, h.kv_transfer_done_s, h.kv_noticed_s, t.first_token_s)
    start, wire_start, done, noticed, first_token = marks
    if start is None or wire_start is None or done is None or noticed is None or first_token is None:
        return None
    # From when decode has the request and prefill has finished (push: decode had it first).
    both = max(t.queued_s, prefill_done_s)
    return {
        "proxy_hop": both - prefill_done_s,
        "admission_wait": start - both,
        "link_queue": wire_start - start,
        "wire": h.kv_wire_s,
        "fixed": done - (wire_start + h.kv_wire_s),
        "notice_wait": noticed - done,
        "first_step": first_token - noticed,
    }
