"""One request's latencies (client side, and its KV handoff itemised), shared by the results table and
the proxy's metrics (numpy only: the proxy actor records them on a hot path and must not import pandas
midway through a run)."""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Sequence

import numpy as np

from messages import RequestTimes

LATENCY_COLUMNS = ("ttft_s", "e2el_s", "tpot_s", "max_gap_s", "p99_itl_s")
"""A request's client-side latencies (`request_latencies`), as the results table names its columns."""


def request_latencies(arrival_s: float, token_times_s: list[float], p99: bool = True) -> dict[str, float]:
    """One request's client-side latencies (NaN where undefined): what the proxy's metrics record and
    the results table's columns read, so both always agree. Plain Python (every request, on the proxy's
    hot path: numpy's per-call overhead outweighs its loops at a few hundred tokens). `p99=False`: no
    `p99_itl_s` (NaN), for a reader that needs none (its sort is most of the cost)."""
    n = len(token_times_s)
    if n < 2:
        return _latencies(arrival_s, token_times_s, math.nan, math.nan)
    gaps = list(map(operator.sub, token_times_s[1:], token_times_s[:-1]))  # b - a, at C speed
    if not p99:
        return _latencies(arrival_s, token_times_s, max(gaps), math.nan)
    gaps.sort()
    return _latencies(arrival_s, token_times_s, gaps[-1], percentile(gaps, 99.0))


def flat_stamps(token_times_s: list[list[float]], lengths: list[int]) -> np.ndarray:
    """Every request's stamps in one array, request after request (`lengths`: each one's count)."""
    return np.fromiter(itertools.chain.from_iterable(token_times_s), float, sum(lengths))


def _latencies(
    arrival_s: float, stamps: Sequence[float], max_gap_s: float, p99_itl_s: float
) -> dict[str, float]:
    """The latencies of a request with these token `stamps`, the largest of its gaps and their 99th
    percentile (NaN for fewer than two tokens)."""
    n = len(stamps)
    if n == 0:
        return dict.fromkeys(LATENCY_COLUMNS, math.nan)
    first_s = stamps[0]
    last_s = stamps[n - 1]
    return {
        "ttft_s": first_s - arrival_s,
        "e2el_s": last_s - arrival_s,
        "tpot_s": (last_s - first_s) / (n - 1) if n > 1 else math.nan,
        "max_gap_s": max_gap_s,
        "p99_itl_s": p99_itl_s,
    }


def percentile(sorted_values: Sequence[float] | np.ndarray, q: float) -> float:
    """`numpy.percentile(values, q)` (its default, linear interpolation), bit for bit, of values
    sorted (or partitioned at `_neighbours`): the rank q/100·(n-1) between its two neighbours."""
    lo, hi, t = _neighbours(len(sorted_values), q)
    a = sorted_values[lo]
    b = sorted_values[hi]
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t  # numpy's lerp, from the nearer end


def percentiles(values: np.ndarray, qs: Sequence[float]) -> list[float]:
    """`percentile` of unsorted, non-empty `values` for each of `qs`: `values` partitioned at just the
    neighbours the ranks read (a replay's million ITLs: ~4x less than a sort)."""
    kth = sorted({i for q in qs for i in _neighbours(values.size, q)[:2]})
    part = np.partition(values, kth)
    return [float(percentile(part, q)) for q in qs]


def _neighbours(n: int, q: float) -> tuple[int, int, float]:
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
    t = times
    marks = (t.kv_transfer_start_s, t.kv_wire_start_s, t.kv_transfer_done_s, t.kv_noticed_s, t.first_token_s)
    start, wire_start, done, noticed, first_token = marks
    if start is None or wire_start is None or done is None or noticed is None or first_token is None:
        return None
    # From when decode has the request and prefill has finished (push: decode had it first).
    both = max(t.queued_s, prefill_done_s)
    return {
        "proxy_hop": both - prefill_done_s,
        "admission_wait": start - both,
        "link_queue": wire_start - start,
        "wire": t.kv_wire_s,
        "fixed": done - (wire_start + t.kv_wire_s),
        "notice_wait": noticed - done,
        "first_step": first_token - noticed,
    }
