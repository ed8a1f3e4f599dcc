"""A step's shape as kernel lookups (`emulation.measured`): whole counts of chunks and decodes, the
sum of kernels over the layers that run them, and the grid that token counts and KV lengths are read on.

A step's chunks are priced as m equal ones: n̄ = P / m new tokens each after c̄ cached, solved from the
keys they attend (`step_shape.keys_attended`: K = m·(n̄·c̄ + n̄(n̄+1)/2)), exact for one chunk; decodes
at their mean KV k̄ = keys / d. A rank's fractional share of chunks or decodes (data-parallel
attention) is priced at the nearest whole count, scaled by their ratio.

Decode-only windows (`step_shape.decode_steps`) ask for many KV lengths at once: the generation
attention is looked up on a grid of 32 points an octave (every token below 64) and interpolated
linearly between the two points around each length, the same way for one step or a window of them,
so a window's steps and single steps get the same bits. The weight GEMMs and element-wise kernels are
read on the same grid by a step's token count: a trace's steps take thousands of token counts, each a
new lookup of every GEMM (~60 µs each), and the grid holds a few hundred (its points at most 1/32 of
an octave apart). Between points the reading is linear where the package's own answer may not be:
its FP8 GEMMs jump just past a power of two (an H200's [4096, 14336] GEMM: 60 µs at 512 tokens, 121 µs
at 513, 102 µs at 768), which the grid spreads over the interval after it (71 µs at 515). The
held-out silicon rows' medians did not move at 0.1-point precision (docs/validation.md)::

    k in [2^e, 2^(e+1)):   step = 2^max(0, e-5)        lo = step·floor(k / step)
                           t(k) = t(lo) + (k - lo)/step · (t(lo + step) - t(lo))
    lo is the grid's point i = lo/step + 32·max(0, e-5), and lo + step its point i + 1
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from emulation.kernel_tables import KernelTime
from emulation.step_shape import StepShape

GRID_POINTS_PER_OCTAVE = 32
"""The lookup grid over token counts and KV lengths (see the module's docstring)."""
GRID_SHIFT = GRID_POINTS_PER_OCTAVE.bit_length() - 1


def chunks_of(rank: StepShape) -> tuple[int, int, int, float] | None:
    """The rank's prompt chunks as equal ones (the module's docstring): a whole count of them, the new
    and cached tokens of each, and the ratio of their real count to the whole one (None: no chunk)."""
    num_chunks = rank.num_requests - rank.num_decodes
    if not rank.num_prefill_tokens or num_chunks <= 0:
        return None
    n = rank.num_prefill_tokens / num_chunks
    cached = max(0.0, (rank.prefill_keys_attended / num_chunks - n * (n + 1) / 2) / n)
    whole = whole_count(num_chunks)
    return whole, whole_count(n), whole_count(cached, least=0), num_chunks / whole


def decodes_of(rank: StepShape) -> tuple[int, Any, float]:
    """The rank's decodes: a whole count of them, their mean KV length (an array over a decode window's
    steps), and the ratio of their real count to the whole one."""
    whole = whole_count(rank.num_decodes)
    return whole, rank.decode_keys_attended / rank.num_decodes, rank.num_decodes / whole


def whole_count(x: float, least: int = 1) -> int:
    """A step's (perhaps fractional: an average rank's share) count of tokens or requests, whole (a
    fractional count of requests is priced at the nearest whole one, scaled by their ratio)."""
    return max(least, round(float(x)))


def layers_of(num_layers: float, kernels: list[KernelTime | None]) -> tuple[float, float] | None:
    """`kernels` run once a layer over `num_layers` layers: their time and its measured part (None:
    one of them has no table)."""
    if any(k is None for k in kernels):
        return None
    s = sum(k.s for k in kernels if k is not None)
    measured = sum(k.s for k in kernels if k is not None and k.measured)
    return num_layers * s, num_layers * measured


def scaled(num_layers: float, priced: tuple[Any, Any] | None) -> tuple[Any, Any] | None:
    """A kernel's (time, measured part), perhaps arrays, run over `num_layers` layers."""
    return None if priced is None else (num_layers * priced[0], num_layers * priced[1])


def total(parts: list[tuple[Any, Any] | None]) -> tuple[Any, Any] | None:
    """The sum of kernels' (time, measured part): None if one has no table, nothing at all if empty."""
    if any(p is None for p in parts):
        return None
    return sum((p[0] for p in parts if p), 0.0), sum((p[1] for p in parts if p), 0.0)


def grid_bracket(k: float) -> tuple[float, float]:
    """The grid's point `lo` at or below `k` (at least 1) and its `step` there (the module's docstring)."""
    k = max(float(k), 1.0)
    step = math.ldexp(1.0, max(0, math.frexp(k)[1] - 1 - GRID_SHIFT))
    return step * math.floor(k / step), step


def grid_point(i: int) -> float:
    """The grid's `i`-th point (counted from 0, every whole number below two octaves' points)."""
    octave = max(0, i // GRID_POINTS_PER_OCTAVE - 1)
    return math.ldexp(i - GRID_POINTS_PER_OCTAVE * octave, octave)


def between(low: tuple[Any, Any] | None, high: tuple[Any, Any] | None, frac: float) -> tuple[Any, Any] | None:
    """Kernels' (time, measured part) a fraction `frac` of the way from `low` to `high` (None: either
    has no table)."""
    if low is None or high is None:
        return None
    return low[0] + frac * (high[0] - low[0]), low[1] + frac * (high[1] - low[1])


def on_kv_grid(lookup: Callable[[float], KernelTime | None], kv_len: Any) -> tuple[Any, Any] | None:
    """`lookup` at the KV length `kv_len` (or each of an array's), interpolated on the module's grid:
    its time and measured part (None: no table). One length or many, the same operations on the same
    doubles (the grid from frexp, powers of two: exact), so the same bits."""
    k: Any  # a length, or an array of them: the same operations on either
    s: Any
    measured: Any
    if isinstance(kv_len, np.ndarray):
        k = np.maximum(kv_len, 1.0)
        octave = np.maximum(0, np.frexp(k)[1] - 1 - GRID_SHIFT)
        step = np.ldexp(1.0, octave)
        lo = step * np.floor(k / step)
        index = (lo / step + GRID_POINTS_PER_OCTAVE * octave).astype(np.intp)  # lo's, counted from 0
        first = int(index.min())
        answers = [lookup(grid_point(i)) for i in range(first, int(index.max()) + 2)]
        if any(a is None for a in answers):
            return None
        s = np.array([a.s for a in answers if a is not None])
        measured = np.array([a.s if a.measured else 0.0 for a in answers if a is not None])
        at_lo = index - first
        at_hi = at_lo + 1  # lo + step: the grid's next point
    else:
        k = max(float(kv_len), 1.0)
        lo, step = grid_bracket(k)
        low, high = lookup(lo), lookup(lo + step)
        if low is None or high is None:
            return None
        s = [low.s, high.s]
        measured = [low.s if low.measured else 0.0, high.s if high.measured else 0.0]
        at_lo, at_hi = 0, 1
    return between((s[at_lo], measured[at_lo]), (s[at_hi], measured[at_hi]), (k - lo) / step)
