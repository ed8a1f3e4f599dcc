"""What the runs say of each candidate under one target: its row of the ranked table, and the
sentences that explain the recommendation, or why no candidate meets the target.

Per candidate: its goodput, the highest load of the grid that meets the target, in the grid's unit
(`load_unit.LoadUnit`), per GPU and per dollar; at that load (or, if it meets the target at no load, at the
lowest load), pooled over the seeds: the requests it completed per emulated second, output tokens per
second per GPU and per user (1 / median TPOT), each term's percentile, the term
that binds (the one furthest past its bound at the next load up, where the target is first missed),
the busiest pool (its engines' share of the span spent in steps) and the handoff's share of the
median TTFT (P/D only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cluster.plan.floors import floors_s
from cluster.plan.load_unit import LoadUnit
from cluster.plan.prices import usd_per_hour
from cluster.plan.search import Outcome, Search
from dashboards.numbers import percent, readable
from workloads.slo import LABELS, SloTerm, duration_label
from workloads.slo_targets import SloTarget

HANDOFF_SHARE_TO_SAY = 0.3
"""A P/D winner's handoff above this share of its median TTFT is worth a sentence."""


@dataclass(frozen=True)
class Row:
    candidate: int
    name: str
    num_gpus: int
    usd_per_hour: float | None
    goodput_load: float | None
    """The highest load of the grid that meets the target; None: none does."""
    score: float | None
    """The goodput load per GPU or per dollar an hour, as the search ranked it (`Candidate.score`)."""
    completed_rps: float | None
    """Completed requests per emulated second at the goodput load (over the seeds' pooled span): below
    the load, as the span includes the last requests' drain (a large share of a short run's)."""
    output_tps_per_gpu: float | None
    tps_per_user: float | None
    values_s: dict[str, float]
    """Each term's percentile at the goodput load (infeasible: the lowest load)."""
    attainment: float | None
    """The share of requests within every bound on their own there."""
    binding: str | None
    binding_ratio: float | None
    """Its value over its bound where it binds (> 1: missed)."""
    bottleneck: str | None
    busy_share: float | None
    handoff_share: float | None
    num_seeds: int
    dropped: str | None
    goodput_under: float | None
    """Stopped by branch and bound: the goodput is below this load (and at least `goodput_load`)."""

    @property
    def goodput_per_gpu(self) -> float | None:
        return None if self.goodput_load is None else self.goodput_load / self.num_gpus

    def goodput_per_usd(self, unit: LoadUnit) -> float | None:
        """What a dollar buys at the goodput load (`unit.per_usd`); None unpriced or meeting nothing."""
        if self.goodput_load is None or not self.usd_per_hour:
            return None
        return unit.per_dollar(self.goodput_load, self.usd_per_hour)

    @property
    def completed_rps_per_gpu(self) -> float | None:
        return None if self.completed_rps is None else self.completed_rps / self.num_gpus


def build_row(
    search: Search, target: SloTarget, c: int, outcome: Outcome, prices: Mapping[str, float], by_cost: bool
) -> Row:
    cand, seeds, g = search.candidates[c], outcome.seeds, outcome.goodput_index
    at = max(g, 0)
    probes = search.probes(c, at, seeds) or []
    frame = search.pooled(c, at, seeds) if probes else None
    span = sum(p.duration_s for p in probes)
    ok = frame[frame["ok"]] if frame is not None else None
    rps = len(ok) / span if ok is not None and span > 0 and g >= 0 else None
    per_user = tokens_per_user_s(ok) if ok is not None else None
    busy: dict[str, float] = {}
    for p in probes:
        for role, share in p.busy_share.items():
            busy[role] = busy.get(role, 0.0) + share / len(probes)
    bottleneck = max(busy, key=lambda r: busy[r]) if busy else None
    handoff = None
    if ok is not None and cand.cfg.pools.prefill.replicas and len(ok):
        handoff = float(ok["handoff_s"].median() / ok["ttft_s"].median())
    where = g + 1 if g + 1 < len(search.loads) else g  # where the target is first missed
    binding, ratio = None, None
    if search.probes(c, where, seeds):
        ratios = target.ratios(search.pooled(c, where, seeds))
        binding = max(ratios, key=lambda k: ratios[k])
        ratio = ratios[binding]
    tokens = float(ok["num_output_tokens"].sum()) if ok is not None else 0.0
    return Row(
        candidate=c,
        name=cand.name,
        num_gpus=cand.num_gpus,
        usd_per_hour=usd_per_hour(cand.gpus, prices),
        goodput_load=search.loads[g] if g >= 0 else None,
        score=cand.score(search.loads[g], prices, by_cost) if g >= 0 else None,
        completed_rps=rps,
        output_tps_per_gpu=tokens / span / cand.num_gpus if rps is not None else None,
        tps_per_user=per_user,
        values_s=target.values_s(frame) if frame is not None else {},
        attainment=target.attainment(frame) if frame is not None else None,
        binding=binding,
        binding_ratio=ratio,
        bottleneck=bottleneck,
        busy_share=busy.get(bottleneck) if bottleneck else None,
        handoff_share=handoff,
        num_seeds=len(seeds),
        dropped=outcome.dropped,
        goodput_under=outcome.goodput_under,
    )


def tokens_per_user_s(ok: pd.DataFrame) -> float | None:
    """Output tokens per second one user sees: 1 / the completed requests' median TPOT."""
    tpot = ok["tpot_s"].dropna()
    median = float(np.median(tpot)) if len(tpot) else math.nan
    return 1.0 / median if median > 0 else None


def rank(rows: Sequence[Row]) -> list[Row]:
    """Best first: those that met the target by goodput load per GPU (or per dollar), as the search
    scored them, ties by the requests per GPU they completed there; survivors of the last round
    ahead of those dropped earlier; then those that met it nowhere."""

    def key(r: Row) -> tuple[bool, bool, float, float, int]:
        return (
            r.score is None,
            r.dropped is not None,
            -(r.score or 0.0),
            -(r.completed_rps_per_gpu or 0.0),
            r.candidate,
        )

    return sorted(rows, key=key)


def explain(
    rows: Sequence[Row], target: SloTarget, search: Search, unit: LoadUnit, by_cost: bool = False
) -> list[str]:
    """A few sentences on the recommendation, or on why there is none."""
    best = rows[0]
    if best.goodput_load is None:
        return infeasible(rows, target, search, unit)
    per_usd = best.goodput_per_usd(unit)
    lines = [
        f"Recommended: {best.name}: meets {target.label} up to {best.goodput_load:g} {unit.unit} on "
        f"{_gpus(best.num_gpus)} ({readable(best.goodput_per_gpu)} {unit.unit} per GPU"
        + (f", {readable(per_usd)} {unit.per_usd}" if per_usd is not None else "")
        + ")."
    ]
    # the next one whose goodput is known exactly: one that reached the last round
    runner_up = next((r for r in rows[1:] if r.score is not None and r.dropped is None), None)
    per = "dollar" if by_cost else "GPU"
    if runner_up is not None and runner_up.score == best.score:
        lines.append(f"It ties with {runner_up.name} on goodput per {per}; it completed more requests there.")
    elif runner_up is not None:
        less = 1.0 - runner_up.score / best.score  # type: ignore[operator]
        lines.append(f"Next best: {runner_up.name}, {percent(less)} less goodput per {per}.")
    if best.binding is not None and best.goodput_load != search.loads[-1]:
        term = term_of(target, best.binding)
        value = best.binding_ratio * term.bound_s  # type: ignore[operator]
        up = search.loads[search.loads.index(best.goodput_load) + 1]
        lines.append(
            f"What binds: one load step up, at {up:g} {unit.unit}, {term.words} reaches {_ms(value)} "
            f"against its {_ms(term.bound_s)} bound."
        )
    elif best.goodput_load == search.loads[-1]:
        lines.append("It meets the target at the grid's highest load: widen --loads to find its limit.")
    if best.bottleneck is not None:
        lines.append(f"Busiest pool: {best.bottleneck} ({percent(best.busy_share)} of the span in steps).")
    if best.handoff_share is not None and best.handoff_share >= HANDOFF_SHARE_TO_SAY:
        link = search.candidates[best.candidate].cfg.kv_transfer.link
        lines.append(
            f"The KV handoff is {percent(best.handoff_share)} of the median TTFT on {link}: a faster fabric "
            "would buy more than more GPUs, or stay collocated."
        )
    return lines


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def infeasible(rows: Sequence[Row], target: SloTarget, search: Search, unit: LoadUnit) -> list[str]:
    """No candidate meets the target at any load: which terms none meets, the closest candidates,
    and the floor that rules the target out where one is known."""
    lines = [
        f"No candidate meets {target.label} at any load of the grid "
        f"(lowest: {search.loads[0]:g} {unit.unit})."
    ]
    measured = [r for r in rows if r.values_s]
    for term in target.terms:
        floor = _lowest_floor(search, term.metric)
        out_of_reach = floor is not None and floor[0] > term.bound_s
        if any(r.values_s[term.name] <= term.bound_s for r in measured) or not (measured or out_of_reach):
            continue
        line = f"No candidate meets {term.label}"
        closest = min(measured, key=lambda r: r.values_s[term.name], default=None)
        if closest is not None:
            line += f": the closest, {closest.name}, reaches {_ms(closest.values_s[term.name])}"
        if floor is not None and out_of_reach:
            line += f"; the floor is {_ms(floor[0])} ({floor[1]}), so no load reaches it"
        elif floor is not None:
            line += f"; its floor is {_ms(floor[0])} ({floor[1]}): queueing and batch-mates add the rest"
        lines.append(line + ".")
    by_worst = sorted(measured, key=lambda r: max(r.values_s[t.name] / t.bound_s for t in target.terms))
    if by_worst:
        names = ", ".join(
            f"{r.name} ({max(r.values_s[t.name] / t.bound_s for t in target.terms):.2f}× its bounds)"
            for r in by_worst[:3]
        )
        lines.append(f"Closest candidates at the lowest load: {names}.")
    return lines


def _lowest_floor(search: Search, metric: str) -> tuple[float, str] | None:
    """The lowest floor of `metric` over the candidates, and where it comes from."""
    found = []
    for cand in search.candidates:
        floors = floors_s(cand.cfg)
        if floors and metric in floors:
            what = (
                f"one {cand.cfg.workload.prompt_len}-token prompt's prefill alone on {cand.name}"
                if metric == "ttft"
                else f"a lone request's {LABELS[metric]} on {cand.name}"
            )
            found.append((floors[metric], what))
    return min(found) if found else None


def term_of(target: SloTarget, term_name: str) -> SloTerm:
    return next(t for t in target.terms if t.name == term_name)


def _ms(seconds: float) -> str:
    return "never (requests failed)" if math.isinf(seconds) else duration_label(seconds, digits=3)
