"""Report plot for runs with KV offload tiers: where each design's prompt tokens came from (the GPU
prefix cache, each offload tier, a pull back from decode) and what was computed, as shares of all its
prompt tokens, a bar per design at each rate; each bar tagged with its design's name (`gid`).

Drawn from the summary records' `prompt_token_share_by_source` (`workloads.summary.prompt_token_shares`),
so the bars are the figures `summary.json` carries, run or sweep alike."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from messages import OFFLOAD_TIERS
from workloads.summary import PROMPT_SOURCES

SHARES = "prompt_token_share_by_source"
"""The records' key (`workloads.summary.summarize`)."""
SOURCES = {
    "gpu": ("GPU prefix cache", "tab:blue"),
    "host": ("host tier", "tab:orange"),
    "disk": ("disk tier", "tab:brown"),
    "shared": ("shared store", "tab:green"),
    "pulled_back": ("pulled back from decode", "tab:purple"),
    "computed": ("computed", "tab:gray"),
}
"""Each of `PROMPT_SOURCES`: its label and colour."""


def offloaded(records: list[dict[str, Any]]) -> bool:
    """Some record's prompt tokens came from an offload tier."""
    return any(r.get(SHARES, {}).get(tier) for r in records for tier in OFFLOAD_TIERS)


def hits_by_tier(records: list[dict[str, Any]]) -> Figure | None:
    """Stacked shares of each design's prompt tokens by source, a bar per record (labelled with its rate
    where the records span more than one); None unless some record loaded KV from an offload tier."""
    if not offloaded(records):
        return None
    rows = [r for r in records if r.get(SHARES)]
    many_rates = len({r["rate"] for r in rows}) > 1
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(rows) + 1.6))
    for r in rows:
        label = f"{r['design']} at {r['rate']:g} req/s" if many_rates else str(r["design"])
        left = 0.0
        for source in PROMPT_SOURCES:
            name, color = SOURCES[source]
            share = float(r[SHARES].get(source) or 0.0)
            ax.barh(label, share, left=left, color=color, gid=r["design"], label=name)
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
