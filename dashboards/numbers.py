"""Numbers as the report prints them: three significant digits, thousands separated, never `1.157e+04`."""

from __future__ import annotations

import math

MISSING = "–"
"""What a missing value (None, NaN) prints as."""


def readable(value: float | None) -> str:
    """`11,570`, `194`, `25.3`, `2.45`, `0.0123`; `–` for None or NaN."""
    if value is None or math.isnan(value):
        return MISSING
    size = abs(value)
    if size >= 100 or size == 0 or float(value).is_integer():
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    if size >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def percent(fraction: float | None) -> str:
    """`63 %`, `2.5 %`, `0.12 %`, `0 %`; `–` for None or NaN."""
    if fraction is None or math.isnan(fraction):
        return MISSING
    pct = 100.0 * fraction
    if abs(pct) >= 10 or pct == 0:
        return f"{pct:.0f} %"
    return f"{pct:.1f} %" if abs(pct) >= 1 else f"{pct:.2g} %"
