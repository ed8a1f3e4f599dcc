"""`testbed plan`'s two plots, each candidate numbered by its rank in the table.

- `pareto_tokens.png`: output tokens/s per GPU against output tokens/s per user (1 / median TPOT),
  one marker per replay the search ran (filled where it met the target), the frontier of those that
  met it drawn through them: the throughput-interactivity trade-off AIConfigurator and NVIDIA's
  benchmarks plot. The key (rank and name) sits beside the axes, never over the data.
- `goodput_cost.png`: each candidate's goodput against its hourly price (or GPUs, unpriced), labelled
  with its rank; candidates on one spot share one label (`2, 3`), and each label is placed where it
  overlaps no other label and no marker (`place_labels`).
"""

from __future__ import annotations

import itertools
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Annotation
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import Bbox

_COLORS = tuple(f"C{i}" for i in range(10))
"""The default cycle's ten colours."""
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
_DIRECTIONS = ((1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1))
"""Where a label may sit around its point, in order of preference (right and above first)."""
_RADII_PT = (3.0, 8.0, 14.0, 22.0, 32.0)
_MARKER_PX = 4.0
"""Half the box a marker keeps free of labels, pixels."""
_WIDTH_IN = 8.0
_DPI = 110
"""Drawn at the dpi they are saved at: a layout fixed at another dpi does not scale exactly (text
widths are not linear in it)."""
_TITLE_CHARS = 90
_KEY: dict[str, Any] = {
    "fontsize": 7,
    "loc": "upper left",
    "bbox_to_anchor": (1.02, 1.0),
    "borderaxespad": 0.0,
    "title": "rank",
}
"""The key of candidates by rank: beside the axes, never over the data."""


def frontier(points: pd.DataFrame) -> pd.DataFrame:
    """The points no other point beats on both axes (tokens/s per user, per GPU), by x."""
    ordered = points.sort_values(["tps_per_user", "tps_per_gpu"], ascending=[False, False])
    best_y, keep = -1.0, []
    for i, row in ordered.iterrows():
        if row["tps_per_gpu"] > best_y:
            keep.append(i)
            best_y = row["tps_per_gpu"]
    return points.loc[keep].sort_values("tps_per_user")


def _title(fig: Figure, what: str, target: str, how: str) -> None:
    """Over the whole figure (axes and key), so that a long target is not cut at the figure's edge."""
    fig.suptitle("\n".join([what, *textwrap.wrap(target, _TITLE_CHARS), how]), fontsize=9)


def _height_in(num_entries: int) -> float:
    """Tall enough for a key of this many entries beside the axes."""
    return max(5.0, 1.5 + 0.17 * num_entries)


def tokens_figure(points: pd.DataFrame, ranks: dict[str, int], target: str) -> Figure:
    """`points`: one row per replay (candidate, tps_per_user, tps_per_gpu, met); `ranks`: each
    candidate's rank in the table; `target`: the target in words."""
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, _height_in(len(ranks))), layout="constrained", dpi=_DPI)
    for name in sorted(set(points["candidate"]), key=lambda n: ranks[n]):
        part = points[points["candidate"] == name]
        i = ranks[name] - 1
        marker, color = _MARKERS[(i // len(_COLORS)) % len(_MARKERS)], _COLORS[i % len(_COLORS)]
        met, missed = part[part["met"]], part[~part["met"]]
        label = f"{i + 1}  {name}"
        ax.scatter(met["tps_per_user"], met["tps_per_gpu"], s=26, marker=marker, color=color, label=label)
        ax.scatter(
            missed["tps_per_user"],
            missed["tps_per_gpu"],
            s=26,
            marker=marker,
            facecolors="none",
            edgecolors=color,
        )
    met_all = points[points["met"]]
    if len(met_all):
        front = frontier(met_all)
        ax.plot(front["tps_per_user"], front["tps_per_gpu"], color="black", lw=1, label="frontier (met)")
    ax.set_xlabel("output tokens/s per user (1 / median TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    _title(
        fig,
        "Throughput against interactivity, every replay",
        target,
        "filled: met the target; hollow: missed",
    )
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**_KEY)
    return fig


def cost_figure(candidates: pd.DataFrame, target: str, load_unit: str) -> Figure:
    """`candidates`: one row per candidate in rank order (rank, name, goodput_load, bounded,
    usd_per_hour, num_gpus, recommended). A candidate meeting the target nowhere sits at 0."""
    priced = bool(candidates["usd_per_hour"].notna().all())
    x = candidates["usd_per_hour"] if priced else candidates["num_gpus"]
    y = candidates["goodput_load"].fillna(0.0)
    fig, ax = plt.subplots(figsize=(_WIDTH_IN, _height_in(len(candidates))), layout="constrained", dpi=_DPI)
    bounded = candidates["bounded"].to_numpy(dtype=bool)
    ax.scatter(x[~bounded], y[~bounded], s=28, color="tab:blue", zorder=3)
    ax.scatter(x[bounded], y[bounded], s=28, facecolors="none", edgecolors="tab:blue", zorder=3)
    ax.margins(x=0.12, y=0.15)
    if not priced:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("price, USD per hour" if priced else "GPUs")
    ax.set_ylabel(f"goodput, {load_unit} (0: the target holds at no load)")
    _title(
        fig,
        "Goodput against cost",
        target,
        "numbers: ranks in the table (bold: recommended); hollow: bounded, at least this",
    )
    ax.legend(
        [Line2D([], [], linestyle="none")] * len(candidates),
        [
            f"{r}  {n}" + ("  (recommended)" if best else "")
            for r, n, best in zip(
                candidates["rank"], candidates["name"], candidates["recommended"], strict=True
            )
        ],
        handlelength=0,
        handletextpad=0,
        **_KEY,
    )
    spots: dict[tuple[float, float], list[tuple[int, bool]]] = {}
    for xi, yi, rank, best in zip(x, y, candidates["rank"], candidates["recommended"], strict=True):
        spots.setdefault((float(xi), float(yi)), []).append((int(rank), bool(best)))
    place_labels(ax, [(xy, _ranks_text([r for r, _ in s]), any(b for _, b in s)) for xy, s in spots.items()])
    return fig


def _ranks_text(ranks: list[int]) -> str:
    """`1, 3-5, 9`: ranks on one spot, runs joined."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return ", ".join(f"{run[0]}" if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)


def place_labels(ax: Axes, labels: list[tuple[tuple[float, float], str, bool]]) -> None:
    """Annotate each point `(xy, text, bold)` where its label stays inside the axes and overlaps no
    label placed before it and no point's marker: the nearest free place of `_RADII_PT` x
    `_DIRECTIONS`, or, where none is free, the one overlapping least. Fixes the figure's layout first
    (labels placed afterwards would move with it)."""
    fig = ax.get_figure()
    assert isinstance(fig, Figure)
    fig.canvas.draw()
    fig.set_layout_engine("none")
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    frame = ax.get_window_extent(renderer)
    pixels = ax.transData.transform([xy for xy, _, _ in labels]) if labels else np.empty((0, 2))
    side = 2 * _MARKER_PX
    taken = [Bbox.from_bounds(px - _MARKER_PX, py - _MARKER_PX, side, side) for px, py in pixels]
    for xy, text, bold in labels:
        best: tuple[float, Annotation] | None = None
        for radius, (dx, dy) in itertools.product(_RADII_PT, _DIRECTIONS):
            ann = ax.annotate(
                text,
                xy,
                xytext=(dx * radius, dy * radius),
                textcoords="offset points",
                fontsize=7,
                fontweight="bold" if bold else "normal",
                ha={1: "left", 0: "center", -1: "right"}[dx],
                va={1: "bottom", 0: "center", -1: "top"}[dy],
                annotation_clip=False,
            )
            box = ann.get_window_extent(renderer)
            cost = _overlap(box, taken) + _outside(box, frame)
            if best is not None and cost >= best[0]:
                ann.remove()
                continue
            if best is not None:
                best[1].remove()
            best = (cost, ann)
            if cost == 0:
                break
        assert best is not None
        taken.append(best[1].get_window_extent(renderer))


def _overlap(box: Bbox, others: list[Bbox]) -> float:
    """The area `box` shares with `others`, pixels."""
    total = 0.0
    for o in others:
        w = min(box.x1, o.x1) - max(box.x0, o.x0)
        h = min(box.y1, o.y1) - max(box.y0, o.y0)
        total += max(w, 0.0) * max(h, 0.0)
    return total


def _outside(box: Bbox, frame: Bbox) -> float:
    """The area of `box` outside `frame`, pixels."""
    return box.width * box.height - _overlap(box, [frame])


def pareto_plots(
    points: pd.DataFrame, candidates: pd.DataFrame, target: str, load_unit: str, out_dir: Path
) -> list[tuple[str, Path]]:
    """Both plots as PNGs in `out_dir` (see `tokens_figure`, `cost_figure`); returns (caption, path)
    each."""
    out_dir.mkdir(parents=True, exist_ok=True)
    ranks = dict(zip(candidates["name"], candidates["rank"], strict=True))
    figures = [
        (
            "pareto_tokens",
            "Output tokens/s per GPU against per user, every replay",
            tokens_figure(points, ranks, target),
        ),
        ("goodput_cost", "Goodput against cost, each candidate", cost_figure(candidates, target, load_unit)),
    ]
    paths = []
    for name, caption, fig in figures:
        paths.append((caption, out_dir / f"{name}.png"))
        fig.savefig(paths[-1][1], dpi=_DPI)
        plt.close(fig)
    return paths
