"""Report plot for runs with KV offload tiers: where each design's prompt tokens came from (the GPU
prefix cache, each offload tier, a pull back from decode) and what was computed, as shares of all its
prompt tokens; each design's bars tagged with its name (`gid`)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from dashboards.plot_style import designs_of
from messages import OFFLOAD_TIERS

SOURCES = (
    ("GPU prefix cache", "tab:blue"),
    ("host tier", "tab:orange"),
    ("disk tier", "tab:brown"),
    ("shared store", "tab:green"),
    ("pulled back from decode", "tab:purple"),
    ("computed", "tab:gray"),
)


def prompt_sources(ok: pd.DataFrame) -> pd.DataFrame:
    """Per design, its prompt tokens by `SOURCES`, as shares of all of them (rows add up to 1)."""

    rows = {}
    for design, part in ok.groupby("design", sort=False):
        tiers = [float(part[f"prompt_{tier}_tokens"].sum()) for tier in OFFLOAD_TIERS]
        gpu = float(part["prompt_cached_tokens"].sum()) - sum(tiers)
        pulled = float(part["prefill_pulled_back_tokens"].fillna(0).sum())
        computed = float(part["prompt_computed_tokens"].sum())
        rows[str(design)] = [gpu, *tiers, pulled, computed]
    frame = pd.DataFrame.from_dict(rows, orient="index", columns=[name for name, _ in SOURCES])
    return frame.div(frame.sum(axis=1), axis=0)


def hits_by_tier(results: pd.DataFrame) -> Figure | None:
    """Stacked shares of each design's prompt tokens by source; None unless some design loaded KV from
    an offload tier."""
    ok = results[results["ok"]]
    if ok.empty or not ok["prompt_offloaded_tokens"].any():
        return None
    shares = prompt_sources(ok)
    designs = [d for d in designs_of(results) if d in shares.index]
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(designs) + 1.6))
    for design in designs:
        left = 0.0
        for (name, color), share in zip(SOURCES, shares.loc[design].to_numpy(dtype=float), strict=True):
            ax.barh(design, share, left=left, color=color, gid=design, label=name)
            left += share
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    ax.legend(
        unique.values(), unique.keys(), fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.25)
    )
    ax.set(xlim=(0, 1), xlabel="share of prompt tokens", title="Where prompt tokens came from")
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig
