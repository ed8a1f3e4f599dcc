"""The report's mixture-of-experts figure: per engine of a MoE target, each step's expert load (the
busiest expert's tokens and the mean expert's), its expert-parallel imbalance and its all-to-all time
(and what dual-batch overlap hid), or under attention-FFN disaggregation its pipeline's bubbles and
exposed transfers, over emulated time.

Drawn from the engines' step logs (engines.json's `moe_steps`, `messages.moe_steps.MoeSteps`): a point a
step, or a run of consecutive steps in a long run (its means). Dense targets log none: no figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from dashboards.plot_style import design_styles, log_axis

MAX_MOE_ROWS = 12
"""Engines drawn at most (a row each); the table beside the figure lists every one."""


def moe_logs(engines: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str, dict[str, list[float]]]]:
    """(design, engine, its MoE step log) of every engine that logged MoE steps, in run order, from
    engines.json's shape: design -> engine -> report (an engine lost without a report has none)."""
    return [
        (design, engine, report["moe_steps"])
        for design, reports in engines.items()
        for engine, report in reports.items()
        if report.get("moe_steps") and report["moe_steps"]["num_steps"]
    ]


def is_afd(log: Mapping[str, list[float]]) -> bool:
    """The engine's steps crossed an attention-FFN cut."""
    return any(log["a2f_bytes"])


def moe_steps_figure(engines: Mapping[str, Mapping[str, Any]]) -> Figure | None:
    """A row per engine (its design's colour): tokens per expert (busiest, mean; log scale: a prompt
    chunk's beside a decode's), EP imbalance, all-to-all ms per step (and, with dual-batch overlap, the
    ms it hid), each against emulated time. Points, not lines: an idle engine has no steps to join."""
    every = moe_logs(engines)
    logs = every[:MAX_MOE_ROWS]
    if not logs:
        return None
    styles = design_styles(dict.fromkeys(design for design, _, _ in logs))
    fig, axes = plt.subplots(len(logs), 3, figsize=(15, 3 * len(logs) + 0.4), squeeze=False)
    for (design, engine, log), (load_ax, imbalance_ax, a2a_ax) in zip(logs, axes, strict=True):
        t = np.asarray(log["end_s"])
        kw = {"color": styles[design].color, "ls": "none", "marker": ".", "ms": 3, "gid": design}
        load_ax.plot(t, log["max_tokens_per_expert"], label="busiest expert", **kw)
        load_ax.plot(t, log["mean_tokens_per_expert"], label="mean expert", alpha=0.3, **kw)
        log_axis(load_ax, np.concatenate([log["max_tokens_per_expert"], log["mean_tokens_per_expert"]]), "y")
        load_ax.set_ylabel("tokens per expert")
        imbalance_ax.plot(t, log["imbalance"], **kw)
        imbalance_ax.axhline(1.0, color="0.6", lw=0.6)
        imbalance_ax.set_ylabel("busiest EP rank / mean")
        if is_afd(log):
            _afd_panel(a2a_ax, t, log, kw)
        else:
            a2a_ax.plot(t, 1000 * np.asarray(log["all_to_all_s"]), label="all-to-all", **kw)
        if any(log["overlap_s"]):
            hidden = {**kw, "color": "0.35", "marker": "x"}
            a2a_ax.plot(t, 1000 * np.asarray(log["overlap_s"]), label="hidden by DBO", **hidden)
        a2a_ax.set_ylim(bottom=0)
        a2a_ax.set_ylabel("ms per step")
        steps, stride = int(sum(log["num_steps"])), max(log["num_steps"])
        per_point = "" if stride == 1 else f", points of {stride} steps' means"
        comm = "AFD pipeline" if is_afd(log) else "all-to-all"
        for ax, what in ((load_ax, "expert load"), (imbalance_ax, "EP imbalance"), (a2a_ax, comm)):
            ax.set_title(f"{design} {engine}:\n{what} ({steps:,} steps{per_point})", fontsize=9)
            ax.set_xlabel("emulated time (s)")
            ax.grid(alpha=0.3)
            if len(ax.lines) > 1 + (ax is imbalance_ax) or (ax is a2a_ax and is_afd(log)):
                ax.legend(fontsize=7, loc="upper right", markerscale=2)
    if len(every) > len(logs):
        fig.suptitle(f"The first {len(logs)} of {len(every)} engines (the table lists every one)")
    fig.tight_layout()
    return fig


def _afd_panel(ax: Any, t: np.ndarray, log: Mapping[str, list[float]], kw: dict[str, Any]) -> None:
    """An AFD engine's pipeline per step: each side's bubbles and the transfers it exposed (ms)."""
    for key, label, colour in (
        ("attention_bubble_s", "attention idle", None),
        ("ffn_bubble_s", "FFN idle", "0.35"),
        ("afd_exposed_s", "exposed transfers", "tab:red"),
    ):
        ax.plot(t, 1000 * np.asarray(log[key]), label=label, **{**kw, "color": colour or kw["color"]})
