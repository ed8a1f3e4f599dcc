"""Report plots for replayed sessions: TTFT by turn, and TTFT by context length (every design), in the
designs' `plot_style` styles, each design's artists tagged with its name (`gid`)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from dashboards.plot_style import design_styles, designs_of


def ttft_by_turn(df: pd.DataFrame) -> Figure | None:
    """Median TTFT of each turn index (sessions only): later turns should hit the prefix cache."""
    ok = df[df["ok"] & df["turn"].notna()]
    if ok.empty or ok["turn"].nunique() < 2:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.6))
    styles = design_styles(designs_of(df))
    for i, (design, part) in enumerate(ok.groupby("design", sort=False)):
        medians = part.groupby("turn")["ttft_s"].median() * 1000.0
        kw = styles[str(design)].line(len(medians), i, len(styles))
        ax.plot(medians.index.astype(int), medians.to_numpy(), label=str(design), gid=str(design), **kw)
    ax.set(xlabel="turn (0: a session's first)", ylabel="median TTFT (ms)", title="TTFT by turn")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def ttft_by_context(df: pd.DataFrame) -> Figure | None:
    """Median TTFT per prompt-length bin (powers of two), with the cached share of the prompt: a long
    context is cheap where its prefix hits (sessions only)."""
    ok = df[df["ok"] & df["turn"].notna()]
    if ok.empty:
        return None
    bins = 2.0 ** np.floor(np.log2(ok["num_prompt_tokens"].clip(lower=1)))
    fig, (ax, hit) = plt.subplots(1, 2, figsize=(11, 3.6))
    styles = design_styles(designs_of(df))
    for i, (design, part) in enumerate(ok.assign(bin=bins).groupby("design", sort=False)):
        by = part.groupby("bin")
        kw = styles[str(design)].line(by.ngroups, i, len(styles)) | {"label": str(design), "gid": str(design)}
        ax.plot(by["ttft_s"].median().index, by["ttft_s"].median() * 1000.0, **kw)
        share = by["prompt_cached_tokens"].sum() / by["num_prompt_tokens"].sum()
        hit.plot(share.index, share.to_numpy(), **kw)
    ax.set(xscale="log", yscale="log", xlabel="prompt tokens (bin start)", ylabel="median TTFT (ms)")
    ax.set_title("TTFT by context length")
    hit.set(xscale="log", ylim=(0, 1.02), xlabel="prompt tokens (bin start)", ylabel="prompt tokens cached")
    hit.set_title("Prefix-cache hits by context length")
    for a in (ax, hit):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    return fig


def divergence_by_turn(df: pd.DataFrame) -> Figure | None:
    """Share of each turn's requests whose greedy tokens left the reference design's (`diverged_at`):
    wrong KV reused, shown as wrong tokens."""
    if "diverged_at" not in df or df["turn"].isna().all():
        return None
    rows = df[df["turn"].notna()]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    styles = design_styles(designs_of(df))
    for i, (design, part) in enumerate(rows.groupby("design", sort=False)):
        share = part.groupby("turn")["diverged_at"].apply(lambda s: s.notna().mean())
        kw = styles[str(design)].line(len(share), i, len(styles))
        ax.plot(share.index.astype(int) + 1, share.to_numpy(), label=str(design), gid=str(design), **kw)
    ax.set(xlabel="turn", ylabel="share diverged", ylim=(-0.02, 1.02), title="Tokens against the reference")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
