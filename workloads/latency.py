"""One request's latencies (client side, and its KV handoff itemised), shared by the results table and
the proxy's metrics (numpy only: the proxy actor records them on a hot path and must not import pandas
midway through a run)."""

from __future__ import annotations

import math
import operator

from messages import RequestTimes


def request_latencies(arrival_s: float, token_times_s: list[float]) -> dict[str, float]:
    """One request's client-side latencies (NaN where undefined): the results table's columns, and what
    the proxy's metrics record, so both always agree. Plain Python (every request, twice, on the hot
    path: numpy's per-call overhead outweighs its loops at a few hundred tokens)."""
    n = len(token_times_s)
    nan = float("nan")
    if n == 0:
        return {"ttft_s": nan, "e2el_s": nan, "tpot_s": nan, "max_gap_s": nan, "p99_itl_s": nan}
    first, last = token_times_s[0], token_times_s[-1]
    gaps = sorted(map(operator.sub, token_times_s[1:], token_times_s[:-1]))  # b - a, at C speed
    return {
        "ttft_s": first - arrival_s,
        "e2el_s": last - arrival_s,
        "tpot_s": (last - first) / (n - 1) if n > 1 else nan,
        "max_gap_s": gaps[-1] if n > 1 else nan,
        "p99_itl_s": percentile(gaps, 99.0) if n > 1 else nan,
    }


def percentile(sorted_values: list[float], q: float) -> float:
    """`numpy.percentile(values, q)` (its default, linear interpolation), bit for bit, of values
    already sorted: the rank q/100·(n-1) between its two neighbours."""
    n = len(sorted_values)
    rank = q / 100 * (n - 1)
    lo = math.floor(rank)
    t = rank - lo
    a, b = sorted_values[lo], sorted_values[min(lo + 1, n - 1)]
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t  # numpy's lerp, from the nearer end


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
