"""What a user sees while a command runs: rich's live bar on a terminal; anywhere else (a pipe, a log
file, CI) a plain line at most every `LINE_EVERY_WALL_S` and one at the end, so that a long run never
looks stuck. And, before a run that will take a while, an estimate of how long.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any

LINE_EVERY_WALL_S = 10.0
"""Wall seconds between progress lines when the output is not a terminal."""


class RunProgress:
    """`with RunProgress("pd-fast: requests", total) as p: ... p.advance()`; `total` None: unknown."""

    def __init__(self, description: str, total: int | None) -> None:
        self.description = description
        self.total = total
        self.done = 0
        self._bar: Any = None
        self._task: Any = None
        self._start_wall_s = time.monotonic()
        self._last_line_wall_s = self._start_wall_s

    def __enter__(self) -> RunProgress:
        if sys.stdout.isatty():
            from rich.progress import Progress

            self._bar = Progress(transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total)
        else:  # what it does, at once: the first periodic line comes only after LINE_EVERY_WALL_S
            print(self._line(), flush=True)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, error, tb)
        elif kind is None:  # (a run Ctrl-C stopped may end here short of its total)
            stopped = self.total is not None and self.done < self.total
            print(f"{self._line()}: {'stopped' if stopped else 'done'}", flush=True)

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.advance(self._task, n)
        else:
            self._maybe_line()

    def describe(self, description: str) -> None:
        """A new description (live runs: the emulated time reached and the lag so far)."""
        self.description = description
        if self._bar is not None:
            self._bar.update(self._task, description=description)
        else:
            self._maybe_line()

    def _maybe_line(self) -> None:
        now = time.monotonic()
        if now - self._last_line_wall_s >= LINE_EVERY_WALL_S:
            self._last_line_wall_s = now
            print(self._line(), flush=True)

    def _line(self) -> str:
        of = f"/{self.total}" if self.total is not None else ""
        elapsed_s = time.monotonic() - self._start_wall_s
        return f"{self.description}: {self.done}{of} after {elapsed_s:.0f} s wall"
