"""Azure LLM inference trace 2023 (Splitwise) CSV: arrivals and lengths, no prefix information.

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,374,44

Replayed open loop at its timestamps (from the first row on); every prompt is its own (no two share a
block), drawn as hash IDs private to its row.
"""

from __future__ import annotations

import csv
from datetime import datetime
from pathlib import Path

from workloads.traces.session import HashPrompt, Session, Trace, TraceError, Turn

BLOCK_SIZE = 512
"""Tokens per synthetic block (the rows share none, so any size works)."""
_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _timestamp(text: str, path: str, line: int) -> float:
    """Seconds since the epoch of a naive `YYYY-MM-DD HH:MM:SS[.fffffff]` (100 ns digits cut to us)."""
    head, _, frac = text.strip().partition(".")
    try:
        stamp = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").timestamp()
        return stamp + (float(f"0.{frac}") if frac else 0.0)
    except ValueError:
        raise TraceError(
            path, line, "TIMESTAMP", f"{text!r}: expected YYYY-MM-DD HH:MM:SS[.fraction]"
        ) from None


def _count(text: str, key: str, minimum: int, path: str, line: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise TraceError(path, line, key, f"{text!r}: expected an integer >= {minimum}")
    return value


def load_azure(path: str | Path) -> Trace:
    path = str(path)
    name = Path(path).name
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != _COLUMNS:
            first = ",".join(header or [])
            shown = first if len(first) <= 60 else first[:57] + "..."
            raise TraceError(path, 1, "header", f"{shown!r}: expected {','.join(_COLUMNS)}")
        sessions = []
        start = last = None
        for line_no, cells in enumerate(reader, 2):
            if not cells:
                continue
            if len(cells) != 3:
                raise TraceError(
                    path, line_no, "row", f"{len(cells)} columns: expected 3 ({','.join(_COLUMNS)})"
                )
            t = _timestamp(cells[0], path, line_no)
            if last is not None and t < last:
                raise TraceError(
                    path, line_no, "TIMESTAMP", f"{cells[0]!r}: earlier than the row before (unsorted)"
                )
            start = t if start is None else start
            last = t
            num_tokens = _count(cells[1], "ContextTokens", 1, path, line_no)
            max_tokens = _count(cells[2], "GeneratedTokens", 1, path, line_no)
            ids = tuple(range(-(-num_tokens // BLOCK_SIZE)))
            prompt = HashPrompt(ids, num_tokens, f"azure/{name}/{line_no}")
            sessions.append(Session(f"request_{line_no}", [Turn(prompt, max_tokens, t - start)]))
    if not sessions:
        raise TraceError(path, None, "rows", "the file holds no requests")
    return Trace(name, sessions, BLOCK_SIZE)
