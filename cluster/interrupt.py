"""Ctrl-C: a command stops where it is, keeps what finished beside its resolved configs, says so in
one line and exits with `EXIT_CODE`.

Each command turns the KeyboardInterrupt into `Interrupted` once it has written what finished;
`cli.main` prints its line. A virtual run stops between two events, its tasks cancelled
(`virtual.run_virtual`); a worker process stops the item under way the same way and may keep what it
finished, then is stopped (`sweep.run_in_processes`); a live run's actors are killed and a Ray started
for it is stopped (`live.run_live`, `cli_run`'s Ray session).
"""

from __future__ import annotations

from pathlib import Path

EXIT_CODE = 130
"""128 + SIGINT, as a shell reports a process that Ctrl-C ended."""


class Interrupted(Exception):
    """Ctrl-C, once the command kept what finished: its message is the one line to print."""

    def __init__(
        self, num_done: int, num_total: int | None, out: Path | None, unit: str = "requests"
    ) -> None:
        of = f" of {num_total:,}" if num_total is not None else ""
        unit = unit if num_done != 1 or of else unit.removesuffix("s")
        where = f"; partial results in {out}" if out is not None else ""
        super().__init__(f"interrupted: {num_done:,}{of} {unit} finished{where}")
