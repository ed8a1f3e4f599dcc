"""The ranked table of one target, as the terminal and report.html both show it: headers in words
with their units, each row's cells as text (the report's number format, `dashboards.numbers`)."""

from __future__ import annotations

from collections.abc import Sequence

from cluster.plan.load_unit import LoadUnit
from cluster.plan.search import BOUNDED
from cluster.plan.verdict import Row, term_of
from dashboards.numbers import MISSING, percent, readable
from dashboards.plan_report import PlanTable
from workloads.slo_targets import SloTarget

_BINDS = "binding\nterm\n(÷ bound,\nnext load)"
_BUSIEST = "busiest\npool\n(in steps)"
_LEFT = "left the\nsearch"
_HANDOFF = "KV\nhandoff\n(share of\nTTFT p50)"
_PER_USER = "output\ntokens/s\nper user"
_PER_GPU = "output\ntokens/s\nper GPU"
_WITHIN = "requests\nwithin\nbounds"
TERMINAL_OPTIONAL = (_LEFT, _HANDOFF, _PER_USER, _PER_GPU, _WITHIN, _BUSIEST)
"""The columns a terminal too narrow for all leaves out, first first: those that least decide a rank."""
TEXT_COLUMNS = frozenset({"candidate", _BINDS, _BUSIEST, _LEFT})
"""Columns of words, read left-aligned; the others are numbers. A header's lines: its words, then its
unit."""
_WRAPPED = frozenset({"candidate", _BINDS, _LEFT})
"""Columns whose cells may wrap at spaces (a number and its unit never part), with the goodput's."""


def plan_table(rows: Sequence[Row], target: SloTarget, unit: LoadUnit, by_cost: bool) -> PlanTable:
    """A row per candidate, best first; the per-dollar column where every GPU is priced, the price
    too when ranking by cost."""
    priced = all(r.usd_per_hour is not None for r in rows)
    goodput = f"goodput\n{unit.unit}"
    headers = [
        "#",
        "candidate",
        "GPUs",
        *(["price\nUSD/h"] if priced and by_cost else []),
        goodput,
        f"goodput\nper GPU\n{unit.unit}",
        *([unit.per_usd.replace(" per ", "\nper ")] if priced else []),
        _PER_GPU,
        _PER_USER,
        _WITHIN,
        _BINDS,
        _BUSIEST,
        _HANDOFF,
        _LEFT,
    ]
    cells = []
    for i, r in enumerate(rows, 1):
        binds = MISSING
        if r.binding is not None and r.binding_ratio is not None:
            binds = f"{term_of(target, r.binding).words} {_ratio(r.binding_ratio)}×"
        cells.append(
            (
                str(i),
                r.name,
                str(r.num_gpus),
                *([readable(r.usd_per_hour)] if priced and by_cost else []),
                goodput_text(r),
                readable(r.goodput_per_gpu),
                *([readable(r.goodput_per_usd(unit))] if priced else []),
                readable(r.output_tps_per_gpu),
                readable(r.tps_per_user),
                percent(r.attainment),
                binds,
                f"{r.bottleneck} {percent(r.busy_share)}" if r.bottleneck else MISSING,
                percent(r.handoff_share),
                r.dropped or "",
            )
        )
    title = f"{target.label}: candidates ranked by goodput per {'dollar' if by_cost else 'GPU'}"
    return PlanTable(title, tuple(headers), tuple(cells), TEXT_COLUMNS, _WRAPPED | {goodput})


def _ratio(ratio: float) -> str:
    """Two decimals; three where two would round a miss (or a meet) to 1.00."""
    return f"{ratio:.3f}" if 0.995 <= ratio < 1.005 and ratio != 1.0 else f"{ratio:.2f}"


def goodput_text(r: Row) -> str:
    """The goodput load; a bounded candidate's open bracket (`0.4 to <0.8`, `<0.8`, `≥0.4`)."""
    if r.dropped == BOUNDED:
        low = f"{r.goodput_load:g}" if r.goodput_load is not None else None
        if r.goodput_under is None:
            return f"≥{low}" if low else "not probed"
        return f"{low} to <{r.goodput_under:g}" if low else f"<{r.goodput_under:g}"
    return f"{r.goodput_load:g}" if r.goodput_load is not None else "none"
