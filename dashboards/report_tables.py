"""The report's tables, as HTML: the summary (a row per design and rate, short headers, readable
numbers), the goodput rates of a sweep, the failures by reason, a MoE target's engines' steps, and a
hybrid target's handoffs and prefix hits."""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import pandas as pd

from dashboards.headline import failure_counts
from dashboards.hybrid_plots import is_hybrid_run
from dashboards.moe_plots import is_afd, moe_logs
from dashboards.numbers import MISSING, percent, readable
from workloads.slo import parse_slo
from workloads.summary import handoffs, moe_means, sweep_goodput


def _rate(value: float | None) -> str:
    return MISSING if value is None else f"{value:g}"


_SUMMARY_COLUMNS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "design": ("design", str),
    "rate": ("rate req/s", _rate),
    "completed": ("done", readable),
    "failed": ("failed", readable),
    "rejected": ("refused", readable),
    "median_ttft_ms": ("TTFT p50 ms", readable),
    "p99_ttft_ms": ("TTFT p99 ms", readable),
    "median_itl_ms": ("ITL p50 ms", readable),
    "p99_itl_ms": ("ITL p99 ms", readable),
    "max_gap_ms": ("max gap ms", readable),
    "median_handoff_ms": ("handoff p50 ms", readable),
    "median_encode_ms": ("encode p50 ms", readable),
    "encoder_busy_fraction": ("encoder busy", percent),
    "encoder_cache_hit_rate": ("encoder cache hits", percent),
    "cpu_overhead_share": ("CPU share", percent),
    "request_throughput": ("req/s done", readable),
    "output_throughput": ("tokens/s", readable),
    "lag_fraction": ("lag", percent),
}
"""Record key: (header, format). The key columns first; a column all missing or zero is left out,
except the counts and lag, whose zero says something."""
_ALWAYS = {"design", "rate", "completed", "failed", "rejected", "lag_fraction"}


def _table(headers: list[str], rows: list[list[str]], css: str, group_col: int | None = None) -> str:
    """Cells are escaped here; a row starting a new value of `group_col` gets the class `first`."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    previous = None
    for row in rows:
        first = group_col is not None and row[group_col] != previous
        previous = row[group_col] if group_col is not None else None
        cells = "".join(f"<td>{html.escape(c)}</td>" for c in row)
        body.append(f'<tr class="first">{cells}</tr>' if first else f"<tr>{cells}</tr>")
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def summary_table(records: list[dict[str, Any]]) -> str:
    """A row per record (design and rate, means over seeds); empty when there is no record."""
    frame = pd.DataFrame(records)
    if frame.empty:
        return "<p>No summary records.</p>"
    keep = [
        k
        for k in _SUMMARY_COLUMNS
        if k in frame and (k in _ALWAYS or pd.to_numeric(frame[k], errors="coerce").fillna(0.0).ne(0.0).any())
    ]
    rows = [
        [_SUMMARY_COLUMNS[k][1](None if pd.isna(r[k]) else r[k]) for k in keep]
        for r in frame[keep].to_dict("records")
    ]
    return _table([_SUMMARY_COLUMNS[k][0] for k in keep], rows, "summary", group_col=0)


def goodput_table(records: list[dict[str, Any]]) -> str:
    """Sweeps: per design and SLO set, the highest offered rate at which it meets the set
    (`sweep_goodput`), a column per set headed by its terms; empty for a run at one rate."""
    if len({r["rate"] for r in records}) < 2:
        return ""
    best = sweep_goodput(records)
    slos = list(dict.fromkeys(s for per in best.values() for s in per))
    rows = [
        [
            design,
            *(
                f"up to {v:g} req/s" if (v := per.get(s)) is not None else "none of the rates tested"
                for s in slos
            ),
        ]
        for design, per in best.items()
    ]
    caption = (
        "<h2>Goodput: the highest offered rate meeting each SLO set: every term's percentile over that "
        "rate's requests within its bound, failed requests infinitely late</h2>"
    )
    return caption + _table(["design", *(parse_slo(s).label for s in slos)], rows, "goodput")


def failures_table(results: pd.DataFrame) -> str:
    """Per design and reason, the failed requests and one full error text; empty when none failed."""
    counts = failure_counts(results)
    if counts.empty:
        return ""
    rows = [
        [
            str(c.design),
            f"{c.requests:,}",
            str(c.reason),
            str(c.example)[:300] if isinstance(c.example, str) else "",
        ]
        for c in counts.itertuples()
    ]
    return "<h2>Failed requests by reason</h2>" + _table(
        ["design", "requests", "reason", "first error text"], rows, "failures", group_col=0
    )


def moe_table(engines: dict[str, Any]) -> str:
    """MoE targets: per engine (engines.json's reports), its steps' means: tokens, tokens per expert
    (busiest, mean), EP imbalance, all-to-all; and the seconds dual-batch overlap hid. Empty for a
    dense target."""
    rows = []
    for design, engine, log in moe_logs(engines):
        m = moe_means(log)
        loads = ("num_steps", "num_tokens", "max_tokens_per_expert", "mean_tokens_per_expert")
        comm = (f"{m['imbalance']:.3f}", readable(1000 * m["all_to_all_s"]), readable(m["dbo_hidden_s"]))
        rows.append([design, engine, *(readable(m[k]) for k in loads), *comm])
    if not rows:
        return ""
    headers = ["design", "engine", "steps", "tokens", "busiest expert tokens", "mean expert tokens",
               "EP imbalance", "all-to-all ms", "DBO hid s"]  # fmt: skip
    caption = "<h2>MoE steps per engine (means per step; expected loads under the routing skew)</h2>"
    return caption + _table(headers, rows, "moe", group_col=0) + _afd_table(engines)


def _afd_table(engines: dict[str, Any]) -> str:
    """Attention-FFN disaggregation: per AFD engine, its steps' means: MB across the cut each way, what
    the transfers exposed, each side's idle time, the FFN rank's utilisation. Empty without AFD."""
    rows = []
    for design, engine, log in moe_logs(engines):
        if is_afd(log):
            m = moe_means(log)
            mb = (readable(m[k] / 1e6) for k in ("a2f_bytes", "f2a_bytes"))
            ms = (readable(1000 * m[k]) for k in ("afd_exposed_s", "attention_bubble_s", "ffn_bubble_s"))
            rows.append([design, engine, *mb, *ms, f"{m['ffn_utilization']:.2f}"])
    if not rows:
        return ""
    headers = ["design", "engine", "A2F MB", "F2A MB", "exposed transfers ms", "attention idle ms",
               "FFN idle ms", "FFN utilisation"]  # fmt: skip
    caption = "<h2>Attention-FFN disaggregation per engine (means per step)</h2>"
    return caption + _table(headers, rows, "afd", group_col=0)


def hybrid_table(results: pd.DataFrame, hybrid: bool = False) -> str:
    """Hybrid targets (`hybrid_plots.is_hybrid_run`): per design, its handoffs' mean KV and SSM state
    (MB), the state's share of the bytes moved, and the prefix-cache hit rate of its successful requests'
    prompts. Empty otherwise."""
    if not is_hybrid_run(results, hybrid):
        return ""
    moved = handoffs(results)
    rows = []
    for design, ok in results[results["ok"]].groupby("design", sort=False):
        part = moved[moved["design"] == design]
        kv, state = part["kv_bytes"], part["state_bytes"]
        share = state.sum() / (kv.sum() + state.sum()) if len(part) else None
        hit_rate = ok["prompt_cached_tokens"].sum() / ok["num_prompt_tokens"].sum()
        mb = (readable(v.mean() / 1e6) for v in (kv, state))  # (no handoff: NaN, printed missing)
        rows.append([str(design), f"{len(part):,}", *mb, percent(share), percent(hit_rate)])
    if not rows:
        return ""
    headers = ["design", "handoffs", "KV MB per handoff", "SSM state MB per handoff", "state share",
               "prefix hit rate"]  # fmt: skip
    caption = "<h2>Hybrid target: handoffs (means) and prefix-cache hits</h2>"
    return caption + _table(headers, rows, "hybrid")
