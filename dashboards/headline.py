"""What a run found, in a few lines computed from its results table and summary records: how many
requests succeeded (failures counted by reason), which design holds which SLO up to which rate, the
handoff's share of TTFT, whether P/D's greedy tokens equal the reference's, the worst stalls, lag."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dashboards.numbers import percent, readable
from dashboards.plot_style import designs_of
from messages.latency import HANDOFF_PARTS
from workloads.slo import parse_slo
from workloads.summary import slo_verdicts, sweep_goodput

_LAG_WARNING = 0.01
"""Lag fraction above which a run's latencies are called invalid (as the CLI's warning)."""
_MAX_REASON_CHARS = 90
_MAX_REASONS = 3
"""Reasons named per design in the headline; the failures table lists them all."""
_HTTP = re.compile(r"HTTP (\d{3}):?\s*(.*)", re.DOTALL)
_MESSAGE = re.compile(r'"(?:message|detail)"\s*:\s*"((?:[^"\\]|\\.)*)')
"""An error body's message (OpenAI's, vLLM's or FastAPI's), also from a body cut short."""
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n")


@dataclass(frozen=True)
class Finding:
    text: str
    warn: bool = False
    """Something that makes the run's figures wrong or incomplete: failures, lag, diverged tokens."""


def failure_reason(finished_reason: str, error: str | None) -> str:
    """A failed request's reason, short enough to count by: an HTTP error's status and its message's
    first sentence (`HTTP 400: This model's maximum context length is 32768 tokens`), an exception's
    first sentence, else the finish reason (`abort`); prefixed by the finish reason unless `error`."""
    if not error:
        return finished_reason
    text = error.strip()
    status = ""
    if m := _HTTP.match(text):
        status, body = f"HTTP {m[1]}: ", m[2]
        message = _MESSAGE.search(body)
        text = _unescape(message[1]) if message else body
    first = _SENTENCE_END.split(text.strip(), maxsplit=1)[0].rstrip(".")
    if len(first) > _MAX_REASON_CHARS:
        first = first[: _MAX_REASON_CHARS - 1] + "…"
    short = (status + first).rstrip(": ")
    return short if finished_reason == "error" else f"{finished_reason}: {short}"


def _unescape(json_string: str) -> str:
    try:
        return str(json.loads(f'"{json_string}"'))
    except ValueError:  # cut short inside an escape
        return json_string


def failure_counts(results: pd.DataFrame) -> pd.DataFrame:
    """Per design and reason (`failure_reason`): the failed requests (not `ok`: errors, aborts and
    refusals), most first within a design, with the first error text as an example."""
    failed = results[~results["ok"].astype(bool)]
    reasons = [
        failure_reason(str(f), e if isinstance(e, str) else None)
        for f, e in zip(failed["finished_reason"], failed["error"], strict=True)
    ]
    order = {d: i for i, d in enumerate(designs_of(results))}
    counts = (
        failed.assign(reason=reasons)
        .groupby(["design", "reason"], sort=False)
        .agg(requests=("reason", "size"), example=("error", "first"))
        .reset_index()
    )
    counts["order"] = counts["design"].map(order)
    return counts.sort_values(["order", "requests"], ascending=[True, False]).drop(columns="order")


def outcome(results: pd.DataFrame) -> list[Finding]:
    """`pd-fast: 0 of 57 succeeded: 57 × HTTP 400: …` per design with failures; one line for the rest."""
    if results.empty:
        return [Finding("No results: the run sent no request.", warn=True)]
    counts = failure_counts(results)
    if counts.empty:
        return [Finding(f"All {len(results):,} requests succeeded.")]
    lines = []
    clean = []
    for design in designs_of(results):
        rows = results[results["design"] == design]
        mine = counts[counts["design"] == design]
        if mine.empty:
            clean.append(design)
            continue
        reasons = [f"{n:,} × {reason}" for reason, n in zip(mine["reason"], mine["requests"], strict=True)]
        if len(reasons) > _MAX_REASONS:
            reasons = [*reasons[:_MAX_REASONS], f"{len(reasons) - _MAX_REASONS} more reasons (table below)"]
        ok = int(rows["ok"].sum())
        lines.append(Finding(f"{design}: {ok:,} of {len(rows):,} succeeded: {'; '.join(reasons)}", warn=True))
    if clean:
        lines.append(Finding(f"{', '.join(clean)}: every request succeeded."))
    return lines


def slo_findings(records: list[dict[str, Any]]) -> list[Finding]:
    """Per SLO set, as every term's percentile over a rate's requests (failed ones infinitely late)
    judges it: sweeps, the highest offered rate at which each design meets it (`sweep_goodput`); one
    rate, whether each design meets it there, and the share of its requests within every bound."""
    frame = pd.DataFrame(records)
    if frame.empty or "slo_attainment" not in frame:
        return []
    slos = list(dict.fromkeys(s for a in frame["slo_attainment"] for s in a))
    rates = sorted(frame["rate"].unique())
    tested = f"{rates[0]:g}–{rates[-1]:g} req/s" if len(rates) > 1 else f"{rates[0]:g} req/s"
    findings = []
    if len(rates) > 1:
        best = sweep_goodput(records)
        for slo in slos:
            held = sorted(best.items(), key=lambda kv: -(kv[1].get(slo) or 0.0))
            words = [
                (f"{d} holds it " if i == 0 else f"{d} ")
                + (f"up to {rate:g} req/s" if (rate := per.get(slo)) is not None else "at none")
                for i, (d, per) in enumerate(held)
            ]
            findings.append(
                Finding(
                    f"SLO {slo} ({parse_slo(slo).label}, over each rate's requests): "
                    f"{', '.join(words)} of the rates tested ({tested})."
                )
            )
    else:
        for slo in slos:
            met = [f"{r['design']} {'meets' if slo_verdicts(r).get(slo) else 'misses'} it" for r in records]
            within = [f"{r['design']} {percent(r['slo_attainment'].get(slo))}" for r in records]
            findings.append(
                Finding(
                    f"At {tested}, SLO {slo} ({parse_slo(slo).label}): {', '.join(met)}; "
                    f"requests within every bound: {', '.join(within)}."
                )
            )
    return findings


def handoff_finding(results: pd.DataFrame) -> Finding | None:
    """P/D designs at the lowest rate (least queueing): the median share of a request's TTFT from
    prefill's token to decode's first (the handoff's parts), and its median in ms."""
    rows = results[results["ok"].astype(bool) & results["handoff_s"].notna()]
    if rows.empty:
        return None
    rate = rows["rate"].min()
    rows = rows[rows["rate"] == rate]
    path_s = rows[[f"handoff_{p}_s" for p in HANDOFF_PARTS]].sum(axis=1, min_count=1)
    by = pd.DataFrame({"design": rows["design"], "share": path_s / rows["ttft_s"], "ms": path_s * 1000.0})
    medians = by.groupby("design", sort=False).median().sort_values("share", ascending=False)
    words = [f"{d} {percent(m.share)} ({readable(m.ms)} ms)" for d, m in medians.iterrows()]
    return Finding(
        f"At {rate:g} req/s, the handoff (prefill's token to decode's first) is this median share of "
        f"TTFT: {', '.join(words)}."
    )


def tokens_finding(results: pd.DataFrame, records: list[dict[str, Any]]) -> Finding | None:
    """Greedy runs with a reference design: per other design, the requests whose tokens equal the
    reference's, of those both completed (`diverged_at`; else the records' `diverged_fraction`)."""
    reference = next((r["reference"] for r in records if r.get("reference")), None)
    if reference is None:
        return None
    others = [r for r in records if r["design"] != reference]
    if "diverged_at" not in results:
        words = [f"{r['design']} {percent(r.get('diverged_fraction'))}" for r in others]
        return Finding(f"Requests whose greedy tokens diverged from {reference}'s: {', '.join(words)}.")
    key = ["request_id", "rate", "seed"]
    done = results[results["ok"].astype(bool)]
    ref = done.loc[done["design"] == reference, key]
    words = []
    diverged = 0
    for design in dict.fromkeys(r["design"] for r in others):
        compared = done[done["design"] == design].merge(ref, on=key)
        equal = int(compared["diverged_at"].isna().sum())
        diverged += len(compared) - equal
        words.append(
            f"{design}'s greedy tokens equal {reference}'s for {equal:,} of {len(compared):,} requests"
        )
    return Finding("; ".join(words) + ".", warn=diverged > 0)


def gap_finding(results: pd.DataFrame) -> Finding | None:
    """Each design's worst inter-token gap: a prefill stalling the decodes beside it shows here."""
    ok = results[results["ok"].astype(bool) & results["max_gap_s"].notna()]
    if ok.empty:
        return None
    worst = ok.groupby("design", sort=False)["max_gap_s"].max() * 1000.0
    words = [f"{d} {readable(ms)} ms" for d, ms in worst.items()]
    return Finding(f"Worst inter-token gap: {', '.join(words)}.")


def prefix_hit_finding(records: list[dict[str, Any]]) -> Finding | None:
    """A replayed trace: the prompt tokens each design found cached (means over seeds and rates)
    beside what an infinite cache would find, keeping prompts only and (where the trace's sessions
    repeat their answers) answers too, as an engine does."""
    record = next((r for r in records if r.get("theoretical_prefix_hit_rate") is not None), None)
    if record is None:
        return None
    achieved = pd.DataFrame(records).groupby("design", sort=False)["prefix_hit_rate"].mean()
    words = [f"{d} {percent(rate)}" for d, rate in achieved.items()]
    ideal = percent(record["theoretical_prefix_hit_rate"])
    with_answers = record.get("theoretical_prefix_hit_rate_with_answers")
    if with_answers is not None and percent(with_answers) != ideal:
        ideal = f"{ideal} keeping prompts only, {percent(with_answers)} keeping answers too"
    return Finding(
        f"Prompt tokens found cached: {', '.join(words)}; an infinite cache would find {ideal} (the "
        "trace's theoretical prefix-hit rate)."
    )


def lag_findings(records: list[dict[str, Any]]) -> list[Finding]:
    """Designs whose steps or handoffs overran their emulated budget (live mode): invalid latencies."""
    findings = []
    for design in dict.fromkeys(r["design"] for r in records):
        mine = [r for r in records if r["design"] == design and r.get("lag_fraction") is not None]
        lag = max((r["lag_fraction"] for r in mine), default=0.0)
        if lag > _LAG_WARNING:
            overrun_ms = max((r.get("max_overrun_ms") or 0.0 for r in mine), default=np.nan)
            findings.append(
                Finding(
                    f"LAG: {design}'s steps and handoffs overran their emulated budget {percent(lag)} of "
                    f"the time (worst by {readable(overrun_ms)} ms): its latencies are not valid.",
                    warn=True,
                )
            )
    return findings


def headline(results: pd.DataFrame, records: list[dict[str, Any]]) -> list[Finding]:
    """The report's opening lines, in this order: outcome, SLOs, handoff, prefix hits, tokens, stalls,
    lag."""
    return [
        *outcome(results),
        *slo_findings(records),
        *filter(
            None,
            [
                handoff_finding(results),
                prefix_hit_finding(records),
                tokens_finding(results, records),
                gap_finding(results),
            ],
        ),
        *lag_findings(records),
    ]
