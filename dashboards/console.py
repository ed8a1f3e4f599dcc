"""Terminal tables of run and sweep summaries."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # the CLI has pandas loaded by then; importing this module needs none
    import pandas as pd


def _fmt(value: Any, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def sweep_table(records: list[dict[str, Any]], title: str) -> Table:
    """Rate rows; TTFT p50, ITL p50 and ITL p99 per design."""
    designs = list(dict.fromkeys(r["design"] for r in records))
    table = Table(title=title)
    table.add_column("rate (req/s)", justify="right")
    for d in designs:
        table.add_column(f"{d}\nTTFT p50 s", justify="right")
        table.add_column(f"{d}\nITL p50 ms", justify="right")
        table.add_column(f"{d}\nITL p99 ms", justify="right")
    by_key = {(r["design"], r["rate"]): r for r in records}
    for rate in sorted({r["rate"] for r in records}):
        row = [f"{rate:g}"]
        for d in designs:
            r = by_key.get((d, rate), {})
            row += [
                _fmt(r.get("median_ttft_ms"), 1e-3, 2),
                _fmt(r.get("median_itl_ms")),
                _fmt(r.get("p99_itl_ms")),
            ]
        table.add_row(*row)
    return table


def presets_table(presets: dict[str, tuple[str, list[str]]]) -> Table:
    """`testbed presets`: each preset, what it emulates, and its designs."""
    table = Table(title="presets (testbed run|sweep|replay --preset NAME [--design A,B])")
    for col in ("preset", "designs", "what it emulates"):
        table.add_column(col, overflow="fold")
    for name, (about, designs) in presets.items():
        table.add_row(name, ", ".join(designs), about)
    return table


def run_table(records: list[dict[str, Any]]) -> Table:
    """One row per design; a replay against a server (`target` in its record) is client-side wall
    time, without the testbed's own columns (offered rate, time scale, lag)."""
    if any("target" in r for r in records):
        return _target_table(records)
    table = Table(title="run summary (emulated time)")
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
    for col in columns:
        table.add_column(col, justify="right")
    for r in records:
        table.add_row(
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
        )
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
    table = Table(title="goodput: highest offered rate with >= 90 % SLO attainment")
    slos = list(dict.fromkeys(s for per in goodput.values() for s in per))
    table.add_column("design")
    for s in slos:
        table.add_column(s, justify="right")
    for design, per in goodput.items():
        table.add_row(design, *[_fmt(per.get(s), digits=2) for s in slos])
    return table


def show(*tables: Table) -> None:
    console = Console(width=max(Console().width, 170))
    for t in tables:
        console.print(t)


def lag_warning(summary: dict[str, Any]) -> None:
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
