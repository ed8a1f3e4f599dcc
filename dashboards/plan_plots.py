"""`testbed plan`'s Pareto views.

- `pareto_tokens.png`: output tokens/s per GPU against tokens/s per user (1 / median TPOT), one
  marker per replay the search ran (filled where it met the target), the frontier of those that met
  it drawn through them: the throughput-interactivity trade-off AIConfigurator and NVIDIA's
  benchmarks plot.
- `goodput_cost.png`: each candidate's goodput against its hourly price (or GPUs, unpriced),
  the recommended one marked.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt
import pandas as pd


def frontier(points: pd.DataFrame) -> pd.DataFrame:
    """The points no other point beats on both axes (tokens/s per user, per GPU), by x."""
    ordered = points.sort_values(["tps_per_user", "tps_per_gpu"], ascending=[False, False])
    best_y, keep = -1.0, []
    for i, row in ordered.iterrows():
        if row["tps_per_gpu"] > best_y:
            keep.append(i)
            best_y = row["tps_per_gpu"]
    return points.loc[keep].sort_values("tps_per_user")


def pareto_plots(points: pd.DataFrame, candidates: pd.DataFrame, title: str, out_dir: Path) -> list[Path]:
    """`points`: one row per replay (candidate, tps_per_user, tps_per_gpu, met); `candidates`: one row
    per candidate (name, goodput_rps, usd_per_hour, num_gpus, recommended). Returns the files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for name, part in points.groupby("candidate", sort=False):
        met = part[part["met"]]
        dots = ax.scatter(met["tps_per_user"], met["tps_per_gpu"], s=22, label=str(name))
        missed = part[~part["met"]]
        ax.scatter(
            missed["tps_per_user"],
            missed["tps_per_gpu"],
            s=22,
            facecolors="none",
            edgecolors=dots.get_facecolor(),
        )
    met_all = points[points["met"]]
    if len(met_all):
        front = frontier(met_all)
        ax.plot(front["tps_per_user"], front["tps_per_gpu"], color="black", lw=1, label="frontier (met)")
    ax.set_xlabel("output tokens/s per user (1 / median TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title(f"{title}\nfilled: the replay met the target; hollow: missed", fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    paths.append(out_dir / "pareto_tokens.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    priced = candidates["usd_per_hour"].notna().all()
    x = candidates["usd_per_hour"] if priced else candidates["num_gpus"]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    y = candidates["goodput_rps"].fillna(0.0)
    ax.scatter(x, y, s=28, color="tab:blue")
    seen: dict[tuple[float, float], int] = {}  # candidates on the same spot: labels stacked
    for xi, yi, name, best in zip(x, y, candidates["name"], candidates["recommended"], strict=True):
        k = seen[(xi, yi)] = seen.get((xi, yi), -1) + 1
        weight = "bold" if best else "normal"
        ax.annotate(
            str(name),
            (xi, yi),
            fontsize=7,
            xytext=(3, 3 + 9 * k),
            textcoords="offset points",
            fontweight=weight,
        )
    ax.set_xlabel("price, USD per hour" if priced else "GPUs")
    ax.set_ylabel("goodput, requests/s (0: meets the target at no load)")
    ax.set_title(f"{title}\ngoodput against cost; bold: recommended", fontsize=9)
    fig.tight_layout()
    paths.append(out_dir / "goodput_cost.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths
