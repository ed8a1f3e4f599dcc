"""Terminal tables of run and sweep summaries."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


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


def run_table(records: list[dict[str, Any]]) -> Table:
    table = Table(title="run summary (emulated time)")
    columns = (
        "design",
        "rate",
        "done",
        "failed",
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
