"""Reading a trace row's fields at the edge: every failure is one `TraceError` naming the file, the
line (1-based; None for a whole-file JSON) and the field, with the value and what is allowed."""

from __future__ import annotations

from typing import Any

from workloads.traces.session import TraceError


class Row:
    def __init__(self, data: Any, path: str, line: int | None, prefix: str = "") -> None:
        """`prefix`: where the row sits in its file (e.g. `requests[3].`), for error messages."""
        if not isinstance(data, dict):
            raise TraceError(path, line, prefix.rstrip(".") or "row", f"expected an object, got {data!r:.60}")
        self.data = data
        self.path = path
        self.line = line
        self.prefix = prefix

    def error(self, key: str, message: str) -> TraceError:
        return TraceError(self.path, self.line, self.prefix + key, message)

    def number(self, key: str, minimum: float = 0.0, default: float | None = None) -> float:
        """A real number >= `minimum` (absent: `default`, or an error when there is none)."""
        value = self.data.get(key)
        if value is None and default is not None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= minimum:
            raise self.error(key, f"{value!r}: expected a number >= {minimum:g}")
        return float(value)

    def integer(self, key: str, minimum: int = 0) -> int:
        value = self.data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(key, f"{value!r}: expected an integer >= {minimum}")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.data.get(key)
        if not isinstance(value, list) or not all(type(v) is int for v in value):
            raise self.error(key, f"{value!r:.60}: expected a list of integers")
        return value

    def optional(self, key: str) -> Any:
        return self.data.get(key)
