"""How the report draws designs, and its check that it drew every one.

Each design keeps one colour, line style and marker in every plot (`design_styles`). Every artist that
draws a design's data carries the design's name as its `gid`; `visible_designs` reads an axes back and
says which designs left visible data inside its view, so a test (or a reader of `plots/`) can tell a
design hidden off-axis, or squeezed to a pixel, from one that was never there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, StrMethodFormatter

_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink")
_LINESTYLES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
_MIN_PATCH_PX = 2.0
"""A bar narrower (or lower) than this, in pixels, does not count as showing its design."""
_LOG_STEPS = ((1.0, 1.5, 2.0, 3.0, 5.0, 7.0), (1.0, 2.0, 5.0), (1.0, 3.0), (1.0,))
"""Log-axis ticks within each decade, densest first: a range of half a decade still gets several."""
_MAX_LOG_TICKS = 9


@dataclass(frozen=True)
class DesignStyle:
    color: str
    linestyle: str
    marker: str
    linewidth: float
    """Earlier designs are drawn wider: a later design's line over an equal one leaves both visible."""

    def line(self, n_points: int = 0, index: int = 0, n_designs: int = 1) -> dict[str, Any]:
        """`plot` keywords; with `n_points`, about eight markers a line, offset per design so that equal
        lines do not stack their markers."""
        kw: dict[str, Any] = {"color": self.color, "ls": self.linestyle, "lw": self.linewidth}
        if n_points:
            every = max(1, n_points // 8)
            kw |= {"marker": self.marker, "ms": 5, "markevery": (index * every // max(n_designs, 1), every)}
        return kw


def designs_of(frame: pd.DataFrame) -> list[str]:
    """The designs of a results table or of summary records, in run order."""
    return [str(d) for d in dict.fromkeys(frame["design"])] if "design" in frame else []


def design_styles(designs: Iterable[str]) -> dict[str, DesignStyle]:
    """One style per design, by position: the same run gives the same styles in every plot."""
    return {
        d: DesignStyle(
            _COLORS[i % len(_COLORS)],
            _LINESTYLES[i % len(_LINESTYLES)],
            _MARKERS[i % len(_MARKERS)],
            max(1.2, 3.0 - 0.7 * i),
        )
        for i, d in enumerate(designs)
    }


def visible_designs(ax: Axes) -> set[str]:
    """The designs (artists' `gid`) with finite data inside `ax`'s view: a line with a point within its
    limits, a bar at least `_MIN_PATCH_PX` wide and high within its drawn box. Call after the layout is
    final (`tight_layout`), as the figure is saved."""
    (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
    box = ax.get_window_extent()
    found: set[str] = set()
    for artist in [*ax.lines, *ax.patches]:
        design = artist.get_gid()
        if design is None or design in found or not artist.get_visible():
            continue
        if isinstance(artist, Line2D):
            xy = np.asarray(artist.get_xydata(), dtype=float)
            x, y = xy[:, 0], xy[:, 1]
            shown = np.isfinite(x) & np.isfinite(y) & (x >= x0) & (x <= x1) & (y >= y0) & (y <= y1)
        elif isinstance(artist, Patch):
            ext = artist.get_window_extent()
            w = min(ext.x1, box.x1) - max(ext.x0, box.x0)
            h = min(ext.y1, box.y1) - max(ext.y0, box.y0)
            shown = np.array([np.isfinite(w) and w >= _MIN_PATCH_PX and h >= _MIN_PATCH_PX])
        else:
            raise TypeError(f"{type(artist).__name__} tagged {design!r}: visible_designs cannot read it")
        if shown.any():
            found.add(str(design))
    return found


def log_axis(ax: Axes, values: np.ndarray, axis: str = "x") -> None:
    """A log axis whose limits are the round ticks around `values` (positive, finite) and whose labels
    cover them: 1, 1.5, 2, 3, 5, 7 per decade, or fewer per decade where the range is wide."""
    values = values[np.isfinite(values) & (values > 0)]
    if not values.size:
        return
    lo, hi = float(values.min()), float(values.max())
    decades = range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
    for steps in _LOG_STEPS:
        candidates = [step * 10.0**decade for decade in decades for step in steps]
        lo_tick = max(c for c in candidates if c <= lo)
        hi_tick = min(c for c in candidates if c >= hi)
        if lo_tick == hi_tick:  # one value: a tick either side
            lo_tick = max(c for c in candidates if c < lo_tick)
            hi_tick = min(c for c in candidates if c > hi_tick)
        ticks = [c for c in candidates if lo_tick <= c <= hi_tick]
        if len(ticks) <= _MAX_LOG_TICKS:
            break
    target = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    (ax.set_xlim if axis == "x" else ax.set_ylim)(lo_tick, hi_tick)
    target.set_major_locator(FixedLocator(ticks))
    target.set_major_formatter(StrMethodFormatter("{x:g}"))
    target.set_minor_locator(NullLocator())
    target.set_minor_formatter(NullFormatter())
