"""The run report: one self-contained `report.html` (plots embedded) plus the plots as PNGs in `plots/`.

Plots: TTFT and ITL CDFs per design, per-request token timelines around each design's worst stall, the
KV handoff distribution (P/D designs), TTFT in parts (rendering, prefill, the handoff's parts), SLO
attainment and goodput against offered rate (sweeps), and for replayed sessions TTFT by turn and by
context length, and (greedy, with a reference design) the share of each turn's tokens that diverged.
Everything is drawn from the per-request results table, so every figure traces back to its rows.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

from dashboards.session_plots import divergence_by_turn, ttft_by_context, ttft_by_turn
from emulation.kv_cache import cdiv
from messages.latency import HANDOFF_PARTS

_SUMMARY_COLUMNS = [
    "design", "rate", "completed", "failed", "rejected", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms",
    "p99_itl_ms", "max_gap_ms", "median_handoff_ms", "median_encode_ms", "encoder_busy_fraction",
    "encoder_cache_hit_rate", "cpu_overhead_share", "request_throughput", "output_throughput", "lag_fraction",
]  # fmt: skip
_STALL_CONTEXT_S = 1.5
"""Emulated seconds shown before and after the worst stall in a timeline."""


def _cdf(ax: Any, values: np.ndarray, label: str) -> None:
    values = np.sort(values[~np.isnan(values)])
    if values.size:
        ax.step(values, np.arange(1, values.size + 1) / values.size, where="post", label=label)


def _small_multiples(n: int, width: float = 5.0, height: float = 3.4) -> tuple[Figure, list[Any]]:
    cols = min(n, 3)
    rows = cdiv(n, cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def latency_cdfs(df: pd.DataFrame) -> tuple[Figure, Figure]:
    """TTFT and ITL CDFs per design: one panel per offered rate."""
    rates = sorted(df["rate"].unique())
    figs = []
    for metric, xlabel in (("ttft", "time to first token (s)"), ("itl", "inter-token latency (ms)")):
        fig, axes = _small_multiples(len(rates))
        for ax, rate in zip(axes, rates, strict=True):
            for design, part in df[(df["rate"] == rate) & df["ok"]].groupby("design", sort=False):
                if metric == "ttft":
                    values = part["ttft_s"].to_numpy(float)
                else:
                    gaps = [np.diff(t) for t in part["token_times_s"]]
                    values = 1000.0 * np.concatenate(gaps or [np.empty(0)])
                _cdf(ax, values, str(design))
            ax.set(title=f"{rate:g} req/s", xlabel=xlabel, ylabel="fraction of " + (
                "requests" if metric == "ttft" else "tokens"))  # fmt: skip
            if metric == "itl":
                ax.set_xscale("log")
                ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
                ax.xaxis.set_major_formatter(ScalarFormatter())
                ax.xaxis.set_minor_formatter(NullFormatter())
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle("TTFT CDF" if metric == "ttft" else "ITL CDF (every gap between two tokens)")
        fig.tight_layout()
        figs.append(fig)
    return figs[0], figs[1]


def stall_timelines(df: pd.DataFrame) -> Figure:
    """Per design, the requests on the engine of its worst inter-token gap, around that gap, all at the
    offered rate (and seed) where the worst gap of any design occurred.

    Each row is a request: a bar from arrival to first token (queue + prefill), a tick per token. The
    worst gap is shaded: the streams that stall while another request's prefill runs show it at once.
    """
    ok = df[df["ok"] & df["max_gap_s"].notna()]
    worst_run = ok.sort_values("max_gap_s").iloc[-1]
    ok = ok[(ok["rate"] == worst_run["rate"]) & (ok["seed"] == worst_run["seed"])]
    designs = list(dict.fromkeys(ok["design"]))
    fig, axes = plt.subplots(len(designs), 1, figsize=(11, 3.2 * max(1, len(designs))), squeeze=False)
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
            ax.plot(shown, np.full(shown.size, y), "|", color=color, markersize=min(7.0, 120 / len(rows)))
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
    pd_rows = df[df["handoff_s"].notna()]
    if pd_rows.empty:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for design, part in pd_rows.groupby("design", sort=False):
        ms = np.round(part["handoff_s"].to_numpy(float) * 1000, 3)  # equal handoffs are one bar
        ax.hist(ms, bins=min(40, len(np.unique(ms))), alpha=0.6, label=str(design))
    ax.set(xlabel="KV handoff (ms, transfer start to done)", ylabel="requests", title="KV handoff")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def ttft_stack(df: pd.DataFrame) -> Figure | None:
    """Every design: TTFT in parts, the median of each stacked: rendering, encoding the images on an
    encoder pool and moving their embeddings (E/P/D), the prompt's queue and compute (collocated: up to
    the first token; P/D: up to prefill's token), then the handoff's parts (P/D)."""
    ok = df[df["ok"]]
    if ok.empty:
        return None
    prompt_done_s = ok["prefill_done_s"].astype(float).fillna(ok["arrival_s"] + ok["ttft_s"])
    parts = {
        "render": ok["render_s"],
        "encode": ok["encode_s"] - ok["ec_transfer_s"],
        "EC transfer": ok["ec_transfer_s"],
        "queue + prefill": prompt_done_s - ok["arrival_s"] - ok["render_s"] - ok["encode_s"],
        **{f"handoff: {p.replace('_', ' ')}": ok[f"handoff_{p}_s"] for p in HANDOFF_PARTS},
    }
    frame = pd.DataFrame({"design": ok["design"], **parts})
    medians = frame.groupby("design", sort=False).median().fillna(0.0) * 1000.0
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.5 * len(medians)))
    left = np.zeros(len(medians))
    for part in parts:
        ax.barh(medians.index.astype(str), medians[part], left=left, label=part)
        left += medians[part].to_numpy()
    ax.set(xlabel="ms (median of each part)", title="Time to first token, from the client's request")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


def goodput_curves(records: list[dict[str, Any]]) -> Figure | None:
    """Sweeps: SLO attainment and goodput against offered rate, one column per SLO set."""
    rates = {r["rate"] for r in records}
    if len(rates) < 2:
        return None
    slos = list(records[0]["slo_attainment"])
    fig, axes = plt.subplots(2, len(slos), figsize=(5.5 * len(slos), 7), squeeze=False)
    frame = pd.DataFrame(records)
    for col, slo in enumerate(slos):
        for design, part in frame.groupby("design", sort=False):
            part = part.sort_values("rate")
            axes[0, col].plot(part["rate"], [a[slo] for a in part["slo_attainment"]], "o-", label=design)
            axes[1, col].plot(part["rate"], [g[slo] for g in part["goodput"]], "o-", label=design)
        axes[0, col].axhline(0.9, color="grey", ls="--", lw=1)
        axes[0, col].set(title=slo, ylabel="SLO attainment", ylim=(0, 1.05))
        axes[1, col].set(xlabel="offered rate (req/s)", ylabel="goodput (req/s)")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def write_report(
    out: Path, results: pd.DataFrame, records: list[dict[str, Any]], title: str, notes: list[str]
) -> Path:
    """Write `out/report.html` and `out/plots/*.png`; returns the HTML's path."""
    figures: list[tuple[str, str, Figure | None]] = [
        *zip(
            ("ttft_cdf", "itl_cdf"),
            ("Time to first token, per design", "Inter-token latency, per design (log scale)"),
            latency_cdfs(results),
            strict=True,
        ),
        ("stalls", "Token timelines around each design's worst stall", stall_timelines(results)),
        ("handoff", "KV handoff time (P/D designs)", handoff_histogram(results)),
        (
            "ttft_parts",
            "Where TTFT goes: rendering, encoding, prefill, the handoff's parts",
            ttft_stack(results),
        ),
        ("goodput", "SLO attainment and goodput against offered rate", goodput_curves(records)),
        ("ttft_by_turn", "Replayed sessions: TTFT by turn", ttft_by_turn(results)),
        (
            "ttft_by_context",
            "Replayed sessions: TTFT and prefix hits by context length",
            ttft_by_context(results),
        ),
        ("divergence", "Greedy tokens against the reference design, by turn", divergence_by_turn(results)),
    ]
    (out / "plots").mkdir(exist_ok=True)
    sections = []
    for name, caption, fig in figures:
        if fig is None:
            continue
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        (out / "plots" / f"{name}.png").write_bytes(buf.getvalue())
        data = base64.b64encode(buf.getvalue()).decode()
        sections.append(
            f'<h2>{html.escape(caption)}</h2><img alt="{name}" src="data:image/png;base64,{data}">'
        )
    frame = pd.DataFrame(records)
    table = frame[[c for c in _SUMMARY_COLUMNS if c in frame and frame[c].notna().any()]]
    page = _PAGE.format(
        title=html.escape(title),
        notes="".join(f"<li>{html.escape(n)}</li>" for n in notes),
        table=table.to_html(index=False, float_format=lambda x: f"{x:.4g}", na_rep="-"),
        sections="\n".join(sections),
    )
    path = out / "report.html"
    path.write_text(page)
    return path


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
td, th {{ border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; }}
img {{ max-width: 100%; }}
</style></head>
<body>
<h1>{title}</h1>
<ul>{notes}</ul>
<h2>Summary (times in emulated ms, throughput per emulated s)</h2>
{table}
{sections}
<p>Per-request rows: <code>results.parquet</code>; resolved configs: <code>configs/</code>;
summaries: <code>summary.json</code>.</p>
</body></html>
"""
