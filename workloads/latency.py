"""One request's client-side latencies, shared by the results table and the proxy's metrics (numpy only:
the proxy actor records them on a hot path and must not import pandas midway through a run)."""

from __future__ import annotations

import numpy as np


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
