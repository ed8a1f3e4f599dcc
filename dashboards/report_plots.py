"""The report's plots of a run's latencies: TTFT and ITL CDFs, token timelines around each design's worst
stall, the KV handoff distribution (P/D designs), TTFT in parts, and (sweeps) SLO attainment and goodput
against offered rate.

Each returns None when it has nothing to draw (no successful request, no P/D design, a single rate).
Every design keeps its `plot_style` style, and every artist drawing a design's data carries the design
as its `gid` (`plot_style.visible_designs`). A design that ran at a panel's rate but has no successful
request there is named in the panel instead of silently missing.
"""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from dashboards.numbers import readable
from dashboards.plot_style import DesignStyle, design_styles, designs_of, log_axis
from emulation.kv_cache import cdiv
from messages.latency import HANDOFF_PARTS
from workloads.slo import parse_slo

_STALL_CONTEXT_S = 1.5
"""Emulated seconds shown before and after the worst stall in a timeline."""
_PART_COLORS = {
    "render": "#848482",
    "encode": "#C2B280",
    "EC transfer": "#A1CAF1",
    "queue + prefill": "#0067A5",
    **dict(
        zip(
            (f"handoff: {p.replace('_', ' ')}" for p in HANDOFF_PARTS),
            ("#F38400", "#BE0032", "#875692", "#882D17", "#E68FAC", "#F3C300", "#008856"),
            strict=True,
        )
    ),
}
"""TTFT's parts in the order they happen, each a colour of its own (Kelly's distinct colours)."""


def _small_multiples(
    n: int, width: float = 5.0, height: float = 3.4, **fig_kw: Any
) -> tuple[Figure, list[Axes]]:
    cols = min(n, 3)
    rows = cdiv(n, cols)
    size = (width * cols if cols > 1 else 1.5 * width, height * rows)  # one panel: room for its title
    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False, **fig_kw)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _title(ax: Axes, rate: float, missing: list[str]) -> None:
    """A panel's rate, and the designs that ran at it without a successful request (drawn nowhere)."""
    ax.set_title(f"{rate:g} req/s")
    if missing:
        ax.set_title("no successful request: " + ", ".join(missing), loc="right", fontsize=8, color="tab:red")


def _cdf(ax: Axes, values: np.ndarray, design: str, style: DesignStyle, index: int, n_designs: int) -> None:
    values = np.sort(values[np.isfinite(values)])
    y = np.arange(1, values.size + 1) / values.size
    ax.step(values, y, where="post", label=design, gid=design, **style.line(values.size, index, n_designs))


def latency_cdfs(df: pd.DataFrame) -> tuple[Figure | None, Figure | None]:
    """TTFT and ITL CDFs, one panel per offered rate, a line per design with a successful request."""
    ok = df[df["ok"]]
    if ok.empty:
        return None, None
    styles = design_styles(designs_of(df))
    rates = sorted(df["rate"].unique())
    figs = []
    for metric in ("ttft", "itl"):
        fig, axes = _small_multiples(len(rates))
        for ax, rate in zip(axes, rates, strict=True):
            at_rate = df[df["rate"] == rate]
            ran = [d for d in styles if (at_rate["design"] == d).any()]
            drawn: list[np.ndarray] = []
            for i, design in enumerate(ran):
                part = at_rate[(at_rate["design"] == design) & at_rate["ok"]]
                if metric == "ttft":
                    values = part["ttft_s"].to_numpy(float)
                else:
                    gaps = [np.diff(t) for t in part["token_times_s"] if len(t) > 1]
                    values = 1000.0 * np.concatenate(gaps or [np.empty(0)])
                if np.isfinite(values).any():
                    _cdf(ax, values, design, styles[design], i, len(ran))
                    drawn.append(values)
            _title(ax, rate, [d for d in ran if d not in {line.get_gid() for line in ax.lines}])
            ax.set_ylabel(f"fraction of {'requests' if metric == 'ttft' else 'gaps'}")
            if metric == "itl":
                ax.set_xlabel("inter-token latency (ms, log scale)")
                log_axis(ax, np.concatenate(drawn or [np.empty(0)]))
            else:
                ax.set_xlabel("time to first token (s)")
            ax.set_ylim(0, 1.03)
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8, loc="lower right" if metric == "ttft" else "center right")
        fig.suptitle("TTFT CDF" if metric == "ttft" else "ITL CDF (every gap between two tokens)")
        fig.tight_layout()
        figs.append(fig)
    return figs[0], figs[1]


def stall_timelines(df: pd.DataFrame) -> Figure | None:
    """Per design, the requests on the engine of its worst inter-token gap, around that gap, all at the
    offered rate (and seed) where the worst gap of any design occurred.

    Each row is a request: a bar from arrival to first token (queue + prefill), a tick per token. The
    worst gap is shaded: the streams that stall while another request's prefill runs show it at once.
    """
    ok = df[df["ok"] & df["max_gap_s"].notna()]
    if ok.empty:
        return None
    worst_run = ok.sort_values("max_gap_s").iloc[-1]
    ok = ok[(ok["rate"] == worst_run["rate"]) & (ok["seed"] == worst_run["seed"])]
    designs = [d for d in designs_of(df) if (ok["design"] == d).any()]
    fig, axes = plt.subplots(len(designs), 1, figsize=(11, 3.2 * len(designs)), squeeze=False)
    for ax, design in zip(axes[:, 0], designs, strict=True):
        worst = ok[ok["design"] == design].sort_values("max_gap_s").iloc[-1]
        times = np.asarray(worst["token_times_s"])
        i = int(np.argmax(np.diff(times)))
        gap_start, gap_end = times[i], times[i + 1]
        lo, hi = gap_start - _STALL_CONTEXT_S, gap_end + _STALL_CONTEXT_S
        same = (df["design"] == design) & (df["rate"] == worst["rate"]) & (df["seed"] == worst["seed"])
        same &= df["engine"] == worst["engine"]
        run = df[same].sort_values("arrival_s")
        rows = [
            r
            for _, r in run.iterrows()
            if len(r["token_times_s"]) and r["arrival_s"] <= hi and r["token_times_s"][-1] >= lo
        ]
        for y, r in enumerate(rows):
            t = np.asarray(r["token_times_s"])
            ax.barh(y, t[0] - r["arrival_s"], left=r["arrival_s"], height=0.5, color="tab:orange", alpha=0.5)
            shown = t[(t >= lo) & (t <= hi)]
            color = "tab:red" if r["request_id"] == worst["request_id"] else "tab:blue"
            size = min(7.0, 120 / len(rows))
            ax.plot(shown, np.full(shown.size, y), "|", color=color, markersize=size, gid=design)
        ax.axvspan(gap_start, gap_end, color="tab:red", alpha=0.12)
        ax.set(xlim=(lo, hi), ylim=(-0.8, len(rows) - 0.2), xlabel="emulated time (s)")
        ax.set_yticks(range(len(rows)), [r["request_id"] for r in rows], fontsize=7)
        ax.set_title(
            f"{design} @ {worst['rate']:g} req/s: worst gap {1000 * (gap_end - gap_start):.0f} ms in "
            f"{worst['request_id']} on {worst['engine']} (orange: waiting for the first token)",
            fontsize=10,
        )
    fig.tight_layout()
    return fig


def handoff_histogram(df: pd.DataFrame) -> Figure | None:
    """The KV handoff (transfer start to done) of each P/D design, a panel each on its own scale:
    designs' handoffs differ by orders of magnitude, and a shared axis squeezes the faster to a line."""
    rows = df[df["handoff_s"].notna()]
    if rows.empty:
        return None
    styles = design_styles(designs_of(df))
    pd_designs = [d for d in styles if (rows["design"] == d).any()]
    fig, axes = _small_multiples(len(pd_designs), 5.0, 3.2)
    for ax, design in zip(axes, pd_designs, strict=True):
        ms = rows.loc[rows["design"] == design, "handoff_s"].to_numpy(float) * 1000.0
        lo, hi = float(ms.min()), float(ms.max())
        pad = max(0.05 * (hi - lo), 0.01 * abs(hi), 1e-3)  # equal handoffs: one bar mid-panel
        ax.hist(ms, bins=np.linspace(lo - pad, hi + pad, 31).tolist(), color=styles[design].color, gid=design)
        median, p99 = np.percentile(ms, [50, 99])
        ax.set_title(f"{design}: median {readable(median)} ms, p99 {readable(p99)} ms", fontsize=10)
        ax.set(xlabel="KV handoff (ms, transfer start to done)", ylabel="requests")
        ax.grid(alpha=0.3)
    fig.suptitle("KV handoff per P/D design (each panel on its own scale)")
    fig.tight_layout()
    return fig


def ttft_parts(ok: pd.DataFrame) -> pd.DataFrame:
    """Per successful request: design, rate, TTFT and its parts in ms (`_PART_COLORS`' order), less the
    parts that are zero or missing for every request (no encoder parts for text, no handoff for
    collocated)."""
    prompt_done_s = ok["prefill_done_s"].astype(float).fillna(ok["arrival_s"] + ok["ttft_s"])
    parts = {
        "render": ok["render_s"],
        "encode": ok["encode_s"] - ok["ec_transfer_s"],
        "EC transfer": ok["ec_transfer_s"],
        "queue + prefill": prompt_done_s - ok["arrival_s"] - ok["render_s"] - ok["encode_s"],
        **{f"handoff: {p.replace('_', ' ')}": ok[f"handoff_{p}_s"] for p in HANDOFF_PARTS},
    }
    applies = {name: s for name, s in parts.items() if s.fillna(0.0).ne(0.0).any()}
    ms = pd.DataFrame(applies).astype(float) * 1000.0
    return pd.concat([ok[["design", "rate"]], (ok["ttft_s"] * 1000.0).rename("ttft_ms"), ms], axis=1)


def ttft_stack(df: pd.DataFrame) -> Figure | None:
    """TTFT in parts, one panel per offered rate (queueing grows with rate: pooled rates would mix it
    in): the median of each part stacked per design, and the median TTFT as a diamond (medians of parts
    need not add up to it)."""
    ok = df[df["ok"]]
    if ok.empty:
        return None
    table = ttft_parts(ok)
    parts = [p for p in _PART_COLORS if p in table]
    designs = designs_of(df)
    rates = sorted(df["rate"].unique())
    fig, axes = _small_multiples(len(rates), 5.0, max(2.2, 1.0 + 0.45 * len(designs)), layout="constrained")
    for ax, rate in zip(axes, rates, strict=True):
        ran = [d for d in designs if ((df["rate"] == rate) & (df["design"] == d)).any()]
        medians = table[table["rate"] == rate].groupby("design").median(numeric_only=True)
        for y, design in enumerate(ran):
            if design not in medians.index:
                continue
            row = medians.loc[design]
            left = 0.0
            for part in parts:
                value = 0.0 if np.isnan(row[part]) else float(row[part])
                ax.barh(y, value, left=left, color=_PART_COLORS[part], label=part, gid=design, height=0.6)
                left += value
            ax.plot(row["ttft_ms"], y, "kD", ms=5, label="median TTFT")
        ax.set_yticks(range(len(ran)), ran)
        ax.set_ylim(len(ran) - 0.5, -0.5)  # the first design on top
        ax.set_xlabel("ms (median of each part)")
        ax.grid(alpha=0.3, axis="x")
        _title(ax, rate, [d for d in ran if d not in medians.index])
    unique: dict[str, Artist] = {}  # a label per part, not per bar
    for ax in axes:
        handles, labels = ax.get_legend_handles_labels()
        unique |= dict(zip(labels, handles, strict=True))
    _legend_below(fig, list(unique.values()), list(unique))
    fig.suptitle("Time to first token in parts, from the client's request, per offered rate")
    return fig


def _legend_below(fig: Figure, handles: list[Artist], labels: list[str], max_cols: int = 5) -> None:
    """A legend under the panels in as many columns (at most `max_cols`) as the figure's width holds
    (wider, its outer labels would be cut off), the figure taller by its height (the panels keep theirs)."""
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg's (matplotlib.use above)
    for ncols in range(min(max_cols, len(labels)), 0, -1):
        legend = fig.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize=9)
        box = legend.get_window_extent(renderer)
        if ncols == 1 or box.width <= 0.98 * fig.bbox.width:
            fig.set_figheight(fig.get_figheight() + box.height / fig.dpi)
            return
        legend.remove()


def goodput_curves(records: list[dict[str, Any]]) -> Figure | None:
    """Sweeps: SLO attainment and goodput against offered rate, one column per SLO set: the share of
    requests within every bound on their own, and those requests a second (whether the set's percentiles
    hold is the goodput table's)."""
    frame = pd.DataFrame(records)
    if frame.empty or frame["rate"].nunique() < 2:
        return None
    styles = design_styles(designs_of(frame))
    slos = list(dict.fromkeys(s for a in frame["slo_attainment"] for s in a))
    if not slos:
        return None
    fig, axes = plt.subplots(2, len(slos), figsize=(5.5 * len(slos), 7), squeeze=False)
    at_inf = _inf_at(frame["rate"])
    for col, slo in enumerate(slos):
        for i, (design, style) in enumerate(styles.items()):
            part = frame[frame["design"] == design].sort_values("rate")
            x = part["rate"].replace(np.inf, at_inf)
            kw = style.line(len(part), i, len(styles)) | {"label": design, "gid": design}
            axes[0, col].plot(x, [a.get(slo, np.nan) for a in part["slo_attainment"]], **kw)
            axes[1, col].plot(x, [g.get(slo, np.nan) for g in part["goodput"]], **kw)
        axes[0, col].set(title=parse_slo(slo).label, ylabel="requests within every bound", ylim=(-0.03, 1.05))
        axes[1, col].set(xlabel="offered rate (req/s)", ylabel="requests within every bound per s")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            if np.isinf(frame["rate"]).any():  # every request at once: a tick of its own past the rest
                ticks = [t for t in ax.get_xticks() if t < at_inf * 0.9]
                ax.set_xticks([*ticks, at_inf], [*(f"{t:g}" for t in ticks), "inf"])
    fig.tight_layout()
    return fig


def _inf_at(rates: pd.Series) -> float:
    """Where a rate of inf (every request at t = 0) is drawn: a quarter past the highest finite one."""
    finite = rates[np.isfinite(rates)]
    return float(finite.max()) * 1.25 if len(finite) else 1.0
