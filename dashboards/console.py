"""Terminal tables of run and sweep summaries, fitted to the terminal's width."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from workloads.run_summary import RunSummary
from workloads.slo import parse_slo

if TYPE_CHECKING:  # the CLI has pandas loaded by then; importing this module needs none
    import pandas as pd


def _fmt(value: Any, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


class FittedTable(Table):
    """A table whose `optional` columns (by header, the first given way first) are left out where the
    terminal is too narrow for all its columns (`show`)."""

    def __init__(
        self, *args: Any, optional: Sequence[str] = (), kept_in: str = "summary.json", **kwargs: Any
    ) -> None:
        """`kept_in`: where the columns left out can be read (the caption says)."""
        super().__init__(*args, **kwargs)
        self.optional = list(optional)
        self.kept_in = kept_in


def sweep_table(records: list[dict[str, Any]], title: str) -> Table:
    """A row per rate and design (a section per rate): TTFT p50, ITL p50 and ITL p99; as narrow for
    ten designs as for one."""
    designs = list(dict.fromkeys(r["design"] for r in records))
    table = Table(title=title)
    for col in ("rate (req/s)", "design", "TTFT p50 s", "ITL p50 ms", "ITL p99 ms"):
        table.add_column(col, justify="left" if col == "design" else "right", overflow="fold")
    by_key = {(r["design"], r["rate"]): r for r in records}
    for rate in sorted({r["rate"] for r in records}):
        ran = [d for d in designs if (d, rate) in by_key]
        for i, d in enumerate(ran):
            r = by_key[(d, rate)]
            table.add_row(
                f"{rate:g}" if i == 0 else "",
                d,
                _fmt(r.get("median_ttft_ms"), 1e-3, 2),
                _fmt(r.get("median_itl_ms")),
                _fmt(r.get("p99_itl_ms")),
                end_section=i == len(ran) - 1,
            )
    return table


def presets_table(presets: dict[str, tuple[str, list[str]]], replays: set[str]) -> Table:
    """`testbed presets`: each preset, what it emulates, and its designs; those in `replays` (their
    workload a trace they do not name) marked as `testbed replay --trace` presets."""
    table = Table(
        title="presets (testbed run|sweep|replay --preset NAME [--design A,B])",
        caption="(replay --trace): run it as testbed replay --preset NAME --trace FILE",
    )
    for col in ("preset", "designs", "what it emulates"):
        table.add_column(col, overflow="fold")
    for name, (about, designs) in presets.items():
        table.add_row(name + ("\n(replay --trace)" if name in replays else ""), ", ".join(designs), about)
    return table


def run_table(records: list[dict[str, Any]]) -> Table:
    """One row per design; a replay against a server (`target` in its record) is client-side wall
    time, without the testbed's own columns (offered rate, time scale, lag)."""
    if any("target" in r for r in records):
        return _target_table(records)
    optional = ("lag %", "time scale", "req/s", "max gap ms", "handoff p50 ms", "ITL p99 ms", "TTFT p99 ms")
    table = FittedTable(title="run summary (emulated time)", optional=optional)
    columns = (
        "design",
        "rate",
        "done",
        "failed",
        "rejected",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "ITL p50 ms",
        "ITL p99 ms",
        "max gap ms",
        "handoff p50 ms",
        "req/s",
        "time scale",
        "lag %",
    )
    # A replayed trace: the prompt tokens found cached beside an infinite cache's share (its ideal),
    # keeping answers too where sessions repeat them, as an engine does.
    replayed = any(r.get("theoretical_prefix_hit_rate") is not None for r in records)
    for col in [*columns, "prefix hits % (ideal)"] if replayed else columns:
        table.add_column(col, justify="right", overflow="fold")
    for r in records:
        cells = [
            r["design"],
            f"{r['rate']:g}",
            str(r["completed"]),
            str(r["failed"]),
            str(r.get("rejected", 0)),
            _fmt(r["median_ttft_ms"]),
            _fmt(r["p99_ttft_ms"]),
            _fmt(r["median_itl_ms"]),
            _fmt(r["p99_itl_ms"]),
            _fmt(r["max_gap_ms"]),
            _fmt(r["median_handoff_ms"]),
            _fmt(r["request_throughput"], digits=3),
            f"{r['time_scale']:g}",
            _fmt(r["lag_fraction"], 100.0, 2),
        ]
        if replayed:
            ideal = r.get("theoretical_prefix_hit_rate_with_answers")
            ideal = r.get("theoretical_prefix_hit_rate") if ideal is None else ideal
            cells.append(f"{_fmt(r['prefix_hit_rate'], 100.0, 1)} ({_fmt(ideal, 100.0, 1)})")
        table.add_row(*cells)
    return table


def _target_table(records: list[dict[str, Any]]) -> Table:
    table = Table(title="replay against a server (client side, wall-clock seconds)")
    columns = ("target", "model", "done", "failed", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms")
    for col in columns:
        table.add_column(col, justify="right")
    for r in records:
        table.add_row(
            r["target"],
            str(r.get("model", "")),
            str(r["completed"]),
            str(r["failed"]),
            _fmt(r["median_ttft_ms"]),
            _fmt(r["p99_ttft_ms"]),
            _fmt(r["median_itl_ms"]),
            _fmt(r["p99_itl_ms"]),
        )
    return table


def goodput_table(goodput: dict[str, dict[str, float | None]]) -> Table:
    """Per design and SLO set, the highest offered rate meeting the set (`sweep_goodput`), req/s; a
    column per set headed by its terms."""
    table = Table(
        title="goodput req/s: the highest offered rate meeting each SLO set (every term's percentile "
        "over the rate's requests, failed ones infinitely late)"
    )
    slos = list(dict.fromkeys(s for per in goodput.values() for s in per))
    table.add_column("design")
    for s in slos:
        table.add_column(parse_slo(s).label, justify="right")
    for design, per in goodput.items():
        table.add_row(design, *[_fmt(per.get(s), digits=2) for s in slos])
    return table


def show(*tables: Table) -> None:
    """Print `tables` within the terminal's width (`COLUMNS` where set; 170 where nothing says, as in
    redirected output): a `FittedTable` leaves out optional columns, then any table too wide wraps its
    headers at spaces, never cutting a value."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(width=170)
    for t in tables:
        if isinstance(t, FittedTable):
            _leave_out(t, console)
        _narrow(t, console)
        console.print(t)


def _bounds(table: Table, console: Console) -> tuple[list[tuple[int, int]], int]:
    """Each column's narrowest and natural width (a `no_wrap` column's narrowest is its natural: its
    values are never cut), and what the table's rules and padding take beside them, in columns."""
    wide = console.options.update_width(10**4)
    bounds = []
    for column in table.columns:
        sizes = [Measurement.get(console, wide, cell) for cell in (column.header, *column.cells)]
        high = max(m.maximum for m in sizes)
        bounds.append((high if column.no_wrap else max(m.minimum for m in sizes), high))
    chrome = Measurement.get(console, wide, table).maximum - sum(high for _, high in bounds)
    return bounds, chrome


def _leave_out(table: FittedTable, console: Console) -> None:
    """Leave out `table`'s optional columns, in order, until its narrowest layout fits the console; its
    caption names those left out."""
    left_out = []
    for header in table.optional:
        bounds, chrome = _bounds(table, console)
        if sum(low for low, _ in bounds) + chrome <= console.width:
            break
        table.columns = [c for c in table.columns if c.header != header]
        left_out.append(header)
    if left_out:
        names = ", ".join(" ".join(h.split()) for h in left_out)
        table.caption = f"left out at {console.width} columns: {names} (all in {table.kept_in})"


def _narrow(table: Table, console: Console) -> None:
    """Where `table` is wider than the console, fix each column's width: its narrowest, and a share of
    the room left in proportion to what its natural width needs more. (Rich's own narrowing shrinks
    the widest columns first, cutting values that would fit.)"""
    bounds, chrome = _bounds(table, console)
    room = console.width - chrome - sum(low for low, _ in bounds)
    if chrome + sum(high for _, high in bounds) <= console.width or room < 0:
        return
    wanted = sum(high - low for low, high in bounds) or 1
    for column, (low, high) in zip(table.columns, bounds, strict=True):
        column.width = low + room * (high - low) // wanted


def lag_warning(summary: RunSummary) -> None:
    """Say loudly that a live run's timing figures are invalid: its host could not keep up."""
    from rich.panel import Panel

    text = (
        f"{summary['design']}: {summary['lag_fraction']:.1%} of steps and handoffs overran their emulated "
        f"budget (worst by {summary['max_overrun_ms']:.1f} ms) at time_scale {summary['time_scale']}.\n"
        "Latency figures of this run are NOT valid. Use a larger --time-scale (or auto), "
        "fewer engines per host, or --compute skip."
    )
    Console(stderr=True).print(Panel(text, title="LAG", style="bold red"))


def turns_table(results: pd.DataFrame, max_turns: int = 12) -> Table | None:
    """Replayed sessions, per design and turn (medians over sessions): prompt tokens computed where
    the prompt was computed, those pulled back from decode (bidirectional), TTFT."""
    rows = results[results["ok"] & results["turn"].notna()]
    if rows.empty or rows["turn"].nunique() < 2:
        return None
    table = Table(title="per turn (medians over sessions; emulated time)")
    for col in ("design", "turn", "sessions", "new tokens computed", "MiB pulled back", "TTFT ms"):
        table.add_column(col, justify="right")
    rows = rows.assign(pulled_mib=rows["prefill_pulled_back_bytes"].fillna(0) / 2**20)
    for (design, turn), part in rows.groupby(["design", "turn"], sort=False):
        index = int(cast(float, turn))  # a float column of ints (NaN outside sessions)
        if index >= max_turns:
            continue
        table.add_row(
            str(design),
            f"{index + 1}",
            str(len(part)),
            _fmt(part["prompt_computed_tokens"].median(), digits=0),
            _fmt(part["pulled_mib"].median(), digits=1),
            _fmt(part["ttft_s"].median(), 1000.0),
        )
    return table
