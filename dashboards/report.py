"""The run report: one self-contained `report.html` (plots embedded) plus the plots as PNGs in `plots/`.

It opens with what the run found (`headline`), then the summary tables (`report_tables`), then the
plots: TTFT and ITL CDFs per design, per-request token timelines around each design's worst stall, the
KV handoff distribution (P/D designs), TTFT in parts (`report_plots`), SLO attainment and goodput against
offered rate (sweeps), and for replayed sessions TTFT by turn and by context length, and (greedy, with a
reference design) the share of each turn's tokens that diverged (`session_plots`); for a MoE target,
each engine's expert load, EP imbalance and all-to-alls per step, with their means (`moe_plots`); for a
hybrid (attention + SSM) target, the KV and SSM state each handoff moved and the prefix hits against
prompt tokens, with a table of their means (`hybrid_plots`); with KV offload tiers, where each design's
prompt tokens came from at each rate (`offload_plots`). Everything is drawn from the per-request results
table and the summary records (the MoE figure and table from the engines' step logs in engines.json,
beside them: `testbed run`, `replay` and `sweep` write it alike), so every figure traces back to its
rows. A run with no successful request (or none at all) still gets its report: the plots that need one
are left out and the headline says why.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from dashboards.headline import headline
from dashboards.hybrid_plots import hybrid_handoff_figure
from dashboards.moe_plots import moe_steps_figure
from dashboards.offload_plots import hits_by_tier
from dashboards.report_plots import (
    goodput_curves,
    handoff_histogram,
    latency_cdfs,
    stall_timelines,
    ttft_stack,
)
from dashboards.report_tables import failures_table, goodput_table, hybrid_table, moe_table, summary_table
from dashboards.session_plots import divergence_by_turn, ttft_by_context, ttft_by_turn
from workloads.summary import measured


def report_figures(
    results: pd.DataFrame,
    records: list[dict[str, Any]],
    engines: dict[str, Any] | None = None,
    hybrid: bool = False,
) -> list[tuple[str, str, Figure | None]]:
    """(file name, caption, figure or None when it has nothing to show), in the page's order; `engines`:
    engines.json's reports (design -> engine -> report), for a MoE target's figure; `hybrid`: the target
    has SSM layers (its figure is drawn without a state handoff too, as collocated)."""
    ttft_cdf, itl_cdf = latency_cdfs(results)
    return [
        ("ttft_cdf", "Time to first token, per design", ttft_cdf),
        ("itl_cdf", "Inter-token latency, per design (log scale)", itl_cdf),
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
        ("prompt_sources", "KV offloading: where prompt tokens came from, by tier", hits_by_tier(records)),
        (
            "moe_steps",
            "MoE target, per engine: expert load, EP imbalance and all-to-all time per step",
            moe_steps_figure(engines or {}),
        ),
        (
            "hybrid_handoff",
            "Hybrid target: KV and SSM state per handoff, and prefix hits, against prompt tokens",
            hybrid_handoff_figure(results, hybrid),
        ),
    ]


def write_report(
    out: Path,
    results: pd.DataFrame,
    records: list[dict[str, Any]],
    title: str,
    notes: list[str],
    hybrid: bool = False,
    on_plot: Callable[[str], None] | None = None,
) -> Path:
    """Write `out/report.html` and `out/plots/*.png` (with `out/engines.json`, where the run wrote it, the
    MoE figure and table; `hybrid`: the target has SSM layers; `on_plot`: told each plot's name once it
    is written); returns the HTML's path."""
    (out / "plots").mkdir(parents=True, exist_ok=True)
    engines = _engines(out, records)
    sections = []
    for name, caption, fig in report_figures(measured(results), records, engines, hybrid):
        if fig is None:
            continue
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        (out / "plots" / f"{name}.png").write_bytes(buf.getvalue())
        if on_plot is not None:
            on_plot(name)
        data = base64.b64encode(buf.getvalue()).decode()
        sections.append(
            f'<h2>{html.escape(caption)}</h2><img alt="{name}" src="data:image/png;base64,{data}">'
        )
    if not results["ok"].any():
        sections.insert(0, "<p>No request succeeded: no latency plots.</p>")
    findings = "".join(
        f'<li class="warn">{html.escape(f.text)}</li>' if f.warn else f"<li>{html.escape(f.text)}</li>"
        for f in headline(results, records)
    )
    said = (f"{r['design']}: {r[k]}" for r in records for k in ("measured_coverage", "trust") if k in r)
    notes = [*notes, *dict.fromkeys(said)]
    page = _PAGE.format(
        title=html.escape(title),
        findings=findings,
        notes="".join(f"<li>{html.escape(n)}</li>" for n in notes),
        table=summary_table(records),
        goodput=goodput_table(records),
        failures=failures_table(results),
        moe=moe_table(engines),
        hybrid=hybrid_table(results, hybrid),
        sections="\n".join(sections),
    )
    path = out / "report.html"
    path.write_text(page)
    return path


def _engines(out: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """engines.json's reports of this run's designs: design -> engine -> report (a sweep's engines named
    with their point, `cluster.sweep.point_engine`)."""
    path = out / "engines.json"
    if not path.exists():
        return {}
    designs = {r.get("design") for r in records}
    return {d: reports for d, reports in json.loads(path.read_text()).items() if d in designs}


_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px;
  padding: 0 1em; color: #222; }}
ul.findings {{ font-size: 1.05em; line-height: 1.5; background: #f4f7fb; padding: 0.6em 0.6em 0.6em 2em; }}
li.warn {{ color: #a00; font-weight: 600; }}
.scroll {{ overflow-x: auto; max-width: 100%; }}
table {{ border-collapse: collapse; font-size: 0.85em; margin-bottom: 1em; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.45em; text-align: right; }}
th {{ background: #f2f2f2; max-width: 6.5em; vertical-align: bottom; }}
td {{ white-space: nowrap; font-variant-numeric: tabular-nums; }}
td:first-child, th:first-child {{ text-align: left; position: sticky; left: 0; background: #fff; }}
th:first-child {{ background: #f2f2f2; }}
tr.first td {{ border-top: 2px solid #888; }}
table.failures td, table.failures th {{ white-space: normal; text-align: left; max-width: 40em; }}
img {{ max-width: 100%; }}
</style></head>
<body>
<h1>{title}</h1>
<h2>Findings</h2>
<ul class="findings">{findings}</ul>
<h2>Run</h2>
<ul>{notes}</ul>
<h2>Summary (emulated ms; throughput per emulated s; means over seeds)</h2>
<div class="scroll">{table}</div>
{goodput}
{failures}
{moe}
{hybrid}
{sections}
<p>Per-request rows: <code>results.parquet</code>; resolved configs: <code>configs/</code>;
summaries: <code>summary.json</code>.</p>
</body></html>
"""
