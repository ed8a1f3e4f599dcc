"""Service-level objectives: the one grammar of SLO terms (`ttft<=2s`, `ttft:p90<=2s`), as configs'
`slos` and `testbed plan --slo` write them, and checking one request against a config's SLO set.

A term is `metric[:pNN]<=NUMBER(ms|s)`: a metric, optionally the percentile of it that the bound holds
for, and the bound. A term without one bounds the 90th percentile (DEFAULT_PERCENTILE): `ttft<=2s` is
`ttft:p90<=2s`. Whether a set holds over a run's requests (each term's percentile within its bound, as
`testbed run`, `sweep` and `plan` judge it) is `workloads.slo_targets`; here each request is checked
against the bounds alone (`Slo.met`), the share of requests within every bound that the proxy's metrics
and a summary's `slo_attainment` report.
"""

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
LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "gap": "worst gap", "e2el": "E2E latency"}
"""How a report names each metric."""
DEFAULT_PERCENTILE = 90.0
"""The percentile a term without one (`ttft<=2s`) bounds."""
GRAMMAR = "metric[:pNN]<=NUMBER(ms|s)"
_TERM = re.compile(r"^(\w+)(?::p([0-9]+(?:\.[0-9]+)?))?<=([0-9]*\.?[0-9]+)(ms|s)$")


class SloError(ValueError):
    pass


@dataclass(frozen=True)
class SloTerm:
    metric: str
    """One of METRICS."""
    percentile: float
    """In (0, 100]: 90 bounds the 90th percentile, 100 the worst."""
    bound_s: float
    """The upper bound, seconds."""

    @property
    def name(self) -> str:
        """`ttft:p90`, whether or not the term was written with its percentile."""
        return f"{self.metric}:p{self.percentile:g}"

    @property
    def text(self) -> str:
        """`ttft:p90<=2s`, `tpot:p90<=0.03s`: the term in the grammar, its percentile and bound in seconds
        written out (a key that names it however it was written)."""
        return f"{self.name}<={self.bound_s:.12g}s"

    @property
    def words(self) -> str:
        """`TTFT p90`."""
        return f"{LABELS[self.metric]} p{self.percentile:g}"

    @property
    def label(self) -> str:
        """`TTFT p90 ≤ 2 s`."""
        return f"{self.words} ≤ {duration_label(self.bound_s)}"


def terms_label(terms: tuple[SloTerm, ...]) -> str:
    """`TTFT p90 ≤ 2 s and TPOT p90 ≤ 50 ms`: every term with its percentile."""
    return " and ".join(t.label for t in terms)


def duration_label(seconds: float, digits: int = 4) -> str:
    """`50 ms`, `1.5 s`: milliseconds under a second, `digits` significant digits."""
    return f"{seconds * 1000:.{digits}g} ms" if seconds < 1 else f"{seconds:.{digits}g} s"


def parse_terms(text: str, field: str) -> tuple[SloTerm, ...]:
    """Comma-joined terms (spaces ignored); one line naming `field` (`slos`, `--slo`), the term and what
    is allowed otherwise."""
    terms = []
    for raw in text.split(","):
        m = _TERM.match(raw.replace(" ", ""))
        if not m:
            raise SloError(
                f"{field}: term {raw.strip()!r} in {text!r} is not `{GRAMMAR}`, e.g. ttft<=2s (its p90) "
                "or ttft:p99<=2s"
            )
        metric, pct, value, unit = m.groups()
        if metric not in METRICS:
            raise SloError(
                f"{field}: metric {metric!r} in {text!r} is unknown; allowed: {', '.join(METRICS)}"
            )
        percentile = DEFAULT_PERCENTILE if pct is None else float(pct)
        if not 0 < percentile <= 100:
            raise SloError(f"{field}: percentile p{pct} in {text!r} must be in (0, 100]")
        bound_s = float(value) / (1000.0 if unit == "ms" else 1.0)
        if bound_s <= 0:
            raise SloError(f"{field}: bound {value}{unit} in {text!r} must be > 0")
        terms.append(SloTerm(metric, percentile, bound_s))
    return tuple(terms)


@dataclass(frozen=True)
class Slo:
    """A config's SLO set, named as written, as one request meets it: within all of its bounds (the
    percentiles are `workloads.slo_targets`'s, over many requests)."""

    name: str
    terms: tuple[SloTerm, ...]

    @property
    def label(self) -> str:
        return terms_label(self.terms)

    def met(self, ok: bool, latencies_s: Mapping[str, float]) -> bool:
        """A finished request (`ok`) within every bound; `latencies_s` has the results table's columns
        (`ttft_s`, ...). A missing value (NaN, e.g. no TPOT for one token) counts as met."""
        if not ok:
            return False
        for term in self.terms:
            value = latencies_s[COLUMNS[term.metric]]
            if not (value != value or value <= term.bound_s):
                return False
        return True


def parse_slo(text: str) -> Slo:
    return Slo(name=text.replace(" ", ""), terms=parse_terms(text, "slos"))
