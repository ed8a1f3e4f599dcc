"""Service-level objectives: parsing `ttft<=2s,tpot<=30ms` and checking requests against them."""

from __future__ import annotations

import re
from dataclasses import dataclass

METRICS = {
    "ttft": "time to first token",
    "tpot": "time per output token after the first",
    "itl": "the request's p99 inter-token latency",
    "gap": "the request's worst inter-token gap",
    "e2el": "end-to-end latency",
}
_TERM = re.compile(r"^\s*(\w+)\s*<=\s*([0-9]*\.?[0-9]+)\s*(ms|s)\s*$")


class SloError(ValueError):
    pass


@dataclass(frozen=True)
class Slo:
    """A named set of upper bounds, all of which a request must meet."""

    name: str
    bounds_s: tuple[tuple[str, float], ...]


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
