"""Latency figures over many requests (a run's summary); one request's own are `messages.latency`."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from messages.latency import neighbours, percentile


def flat_stamps(token_times_s: list[list[float]], lengths: list[int]) -> np.ndarray:
    """Every request's stamps in one array, request after request (`lengths`: each one's count)."""
    return np.fromiter(itertools.chain.from_iterable(token_times_s), float, sum(lengths))


def gaps(token_times: list[list[float]]) -> np.ndarray:
    """Every request's inter-token gaps, request after request: one difference over all the stamps,
    less those across two requests (numpy per request costs more than the arithmetic)."""
    if not token_times:
        return np.empty(0)
    lengths = [len(t) for t in token_times]
    flat = flat_stamps(token_times, lengths)
    return np.delete(np.diff(flat), np.cumsum(lengths)[:-1] - 1)


def percentiles(values: np.ndarray, qs: Sequence[float]) -> list[float]:
    """`percentile` of unsorted, non-empty `values` for each of `qs`: `values` partitioned at just the
    neighbours the ranks read (a replay's million ITLs: ~4x less than a sort)."""
    kth = sorted({i for q in qs for i in neighbours(values.size, q)[:2]})
    part = np.partition(values, kth)
    return [float(percentile(part, q)) for q in qs]
