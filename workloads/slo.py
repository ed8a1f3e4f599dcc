"""Service-level objectives: parsing `ttft<=2s,tpot<=30ms` and checking requests against them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

METRICS = {
    "ttft": "time to first token",
    "tpot": "time per output token after the first",
    "itl": "the request's p99 inter-token latency",
    "gap": "the request's worst inter-token gap",
    "e2el": "end-to-end latency",
}
COLUMNS = {"ttft": "ttft_s", "tpot": "tpot_s", "itl": "p99_itl_s", "gap": "max_gap_s", "e2el": "e2el_s"}
"""The results-table column each metric bounds."""
_TERM = re.compile(r"^\s*(\w+)\s*<=\s*([0-9]*\.?[0-9]+)\s*(ms|s)\s*$")


class SloError(ValueError):
    pass


@dataclass(frozen=True)
class Slo:
    """A named set of upper bounds, all of which a request must meet."""

    name: str
    bounds_s: tuple[tuple[str, float], ...]

    def met(self, ok: bool, latencies_s: Mapping[str, float]) -> bool:
        """A finished request (`ok`) within every bound; `latencies_s` has the results table's columns
        (`ttft_s`, ...). A missing value (NaN, e.g. no TPOT for one token) counts as met."""
        if not ok:
            return False
        for metric, bound in self.bounds_s:
            value = latencies_s[COLUMNS[metric]]
            if not (value != value or value <= bound):
                return False
        return True


def parse_slo(text: str) -> Slo:
    bounds = []
    for term in text.split(","):
        m = _TERM.match(term)
        if not m:
            raise SloError(f"slos: term {term.strip()!r} in {text!r} is not `metric<=NUMBER(ms|s)`")
        metric, value, unit = m.groups()
        if metric not in METRICS:
            raise SloError(f"slos: metric {metric!r} in {text!r} is unknown; allowed: {', '.join(METRICS)}")
        bounds.append((metric, float(value) / (1000.0 if unit == "ms" else 1.0)))
    return Slo(name=text.replace(" ", ""), bounds_s=tuple(bounds))
