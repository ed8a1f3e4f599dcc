"""The report's hybrid-target figure (attention + SSM layers): what a P/D handoff moves and where the
prefix cache hits.

Left: bytes per handoff against prompt tokens, the attention KV (it grows with the prompt) and the SSM
state (a fixed size a request) as two series, with the prompt length where they cross (below it the
state outweighs the KV). Right: the prompt tokens the prefix cache served against prompt tokens: in
vLLM's align mode a state is cached only at a prompt's checkpoint (the last block boundary before its
last token), so hits land on multiples of the (raised) block size only.

Drawn from the per-request results table (`kv_bytes`, `state_bytes`, `num_prompt_tokens`,
`prompt_cached_tokens`), for a run whose handoffs moved a state, or of a target with SSM layers; the
handoffs are the summary's (`workloads.summary.handoffs`, whose means each record carries).
"""

from __future__ import annotations

import math
from functools import reduce
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MultipleLocator

from dashboards.numbers import readable
from dashboards.plot_style import DesignStyle, design_styles, designs_of, log_axis
from workloads.summary import handoffs

KV_COLOR, STATE_COLOR = "tab:blue", "tab:orange"
"""Each series its colour; each design its marker (`plot_style`)."""
_MAX_HIT_TICKS = 12
"""Block multiples marked on the hits' axis at most."""


def is_hybrid_run(results: pd.DataFrame, hybrid: bool = False) -> bool:
    """`hybrid` (the target has SSM layers), or some handoff of `results` moved an SSM state."""
    return hybrid or ("state_bytes" in results and bool((results["state_bytes"].fillna(0) > 0).any()))


def kv_bytes_per_token(rows: pd.DataFrame) -> float | None:
    """The KV a handoff moves per prompt token, from its handoffs: the least of their KV bytes over the
    tokens each must move (the prompt but its last, which decode computes, and decode's own prefix hit).
    Whole blocks move, so each ratio is at least the true one, and equal for a prompt that fills its
    blocks; None without KV moved."""
    tokens = rows["num_prompt_tokens"] - 1 - rows["decode_cached_tokens"].fillna(0)
    ratios = rows["kv_bytes"][(rows["kv_bytes"] > 0) & (tokens > 0)] / tokens
    return float(ratios.min()) if len(ratios) else None


def crossover_tokens(rows: pd.DataFrame) -> float | None:
    """Prompt tokens where the KV a handoff moves equals its SSM state (the median handoff's); None
    without both."""
    per_token = kv_bytes_per_token(rows)
    state = rows.loc[rows["state_bytes"] > 0, "state_bytes"]
    if per_token is None or state.empty:
        return None
    return float(state.median() / per_token)


def hybrid_handoff_figure(results: pd.DataFrame, hybrid: bool = False) -> Figure | None:
    """Bytes per handoff (KV, state) and prefix hits against prompt tokens, every design; None unless
    `is_hybrid_run` and some request succeeded."""
    if not is_hybrid_run(results, hybrid) or not results["ok"].any():
        return None
    styles = design_styles(designs_of(results))
    fig, (bytes_ax, hits_ax) = plt.subplots(1, 2, figsize=(13, 4.2))
    _bytes_panel(bytes_ax, handoffs(results), styles)
    _hits_panel(hits_ax, results[results["ok"]], styles)
    fig.tight_layout()
    return fig


def _bytes_panel(ax: Axes, rows: pd.DataFrame, styles: dict[str, DesignStyle]) -> None:
    """KV and state bytes per handoff against prompt tokens (log-log: the KV a line of slope 1, the
    state flat), each design's crossover marked."""
    if rows.empty:
        ax.text(0.5, 0.5, "no P/D handoff", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    many = len(set(rows["design"])) > 1
    xs: list[float] = []
    ys: list[float] = []
    for design, part in rows.groupby("design", sort=False):
        name = str(design)
        kw: dict[str, Any] = {"ls": "none", "marker": styles[name].marker, "ms": 4, "gid": name}
        suffix = f" ({name})" if many else ""
        for column, label, color in (("kv_bytes", "KV", KV_COLOR), ("state_bytes", "SSM state", STATE_COLOR)):
            shown = part[part[column] > 0]
            ax.plot(shown["num_prompt_tokens"], shown[column] / 1e6, color=color, label=label + suffix, **kw)
            ys += (shown[column] / 1e6).tolist()
        xs += part["num_prompt_tokens"].tolist()
        xs += _crossover(ax, part, suffix)
    log_axis(ax, np.asarray(xs, dtype=float), "x")
    span = [min(ys, default=0.0) / 1.25, 1.25 * max(ys, default=0.0)]  # room around the points
    log_axis(ax, np.asarray([*ys, *span], dtype=float), "y")
    ax.set(xlabel="prompt tokens", ylabel="MB per handoff", title="What a handoff moves")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")


def _crossover(ax: Axes, part: pd.DataFrame, suffix: str) -> list[float]:
    """The KV's trend (bytes per prompt token) and the state's level as dashed lines out to where they
    cross, and the crossover marked; the x values drawn (none without a crossover)."""
    x = crossover_tokens(part)
    if x is None:
        return []
    state = float(part.loc[part["state_bytes"] > 0, "state_bytes"].median()) / 1e6
    lo, hi = float(part["num_prompt_tokens"].min()), float(part["num_prompt_tokens"].max())
    lo, hi = min(lo, x) / 1.5, max(hi, x) * 1.5
    trend: dict[str, Any] = {"ls": "--", "lw": 1, "alpha": 0.7}
    per_token = f"KV at {readable(1e6 * state / x)} B a prompt token{suffix}"
    ax.plot([lo, hi], [state * lo / x, state * hi / x], color=KV_COLOR, label=per_token, **trend)
    ax.plot([lo, hi], [state, state], color=STATE_COLOR, **trend)
    ax.axvline(x, color="0.3", ls=":", lw=1, label=f"state = KV at {readable(x)} prompt tokens{suffix}")
    return [x / 1.2, x * 1.2]


def _hits_panel(ax: Axes, ok: pd.DataFrame, styles: dict[str, DesignStyle]) -> None:
    """Prompt tokens the prefix cache served against prompt tokens, per design; the hits' axis ticked at
    the multiples they share (the block size, in align mode)."""
    for design, part in ok.groupby("design", sort=False):
        name, style = str(design), styles[str(design)]
        kw: dict[str, Any] = {"ls": "none", "ms": 4, "gid": name, "label": name}
        ax.plot(
            part["num_prompt_tokens"],
            part["prompt_cached_tokens"],
            color=style.color,
            marker=style.marker,
            **kw,
        )
    top = float(ok["num_prompt_tokens"].max())
    ax.plot([0, top], [0, top], color="0.6", lw=0.8, ls="--", label="whole prompt")
    ax.set_xlim(0, top * 1.03)
    ax.set_ylim(-0.02 * top, top * 1.03)
    hits = ok.loc[ok["prompt_cached_tokens"] > 0, "prompt_cached_tokens"].astype(int)
    unit = reduce(math.gcd, hits.tolist(), 0)
    if unit > 1 and top / unit <= _MAX_HIT_TICKS:
        ax.yaxis.set_major_locator(MultipleLocator(unit))
    what = "none" if hits.empty else f"at multiples of {unit:,} tokens"
    ax.set(xlabel="prompt tokens", ylabel="prompt tokens cached", title=f"Prefix-cache hits ({what})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
