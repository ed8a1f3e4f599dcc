"""SLO targets with percentiles, as a capacity plan states them: `ttft:p90<=2s,tpot:p90<=50ms`, in
`workloads.slo`'s grammar (a term without a percentile, `ttft<=2s`, bounds the p90).

A target holds when every term's percentile over a run's requests is within its bound. Unlike
`workloads.slo` (each request checked against bounds, the share that meets them reported), a target
is one yes or no per run, the question a design search asks at each offered load: "does this design
keep p90 TTFT under 2 s at 1.5 req/s?" A config's SLO sets are judged the same way by `testbed run`
and `testbed sweep`: a summary records each term's `TermCount`, counts that add up over runs, so that
a sweep's seeds are judged together as `testbed plan` judges its (their tables concatenated).

What each metric's percentile is taken over (a request that failed or was rejected counts as an
infinitely late one, so that a design cannot meet a target by dropping requests):

    ttft, tpot, e2el  one value per request (the results table's `ttft_s`, `tpot_s`, `e2el_s`;
                      a one-token answer has no TPOT and is left out of tpot)
    gap               one value per request: its worst inter-token gap (`max_gap_s`)
    itl               every inter-token gap of every request, pooled (vLLM's bench ITL percentiles;
                      a failed request counts as many late gaps as a completed one has on average)

A percentile is the smallest value with at least that share of the population at or below it
(numpy's `inverted_cdf`, its rank computed exactly: `rank`), not the interpolated ones of
`testbed run`'s summary: a p90 term holds exactly when at least 90 % of its population is within it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd

from workloads.latency import gaps
from workloads.slo import COLUMNS, SloTerm, parse_terms, terms_label

_PER_REQUEST = {m: c for m, c in COLUMNS.items() if m != "itl"}
"""The results-table column of each metric taken once per request."""


@dataclass(frozen=True)
class TermCount:
    """One term over some requests, in counts that add up: the counts over several runs' requests
    together (a sweep's seeds) are the sums of each run's."""

    num_within: int
    """Values of completed requests within the term's bound."""
    num_values: int
    """Values of completed requests: one a request (none where it has none, e.g. a one-token answer's
    TPOT), or for itl every inter-token gap."""
    num_ok: int
    """Completed requests."""
    num_failed: int
    """Requests that failed or were rejected: infinitely late."""

    def holds(self, term: SloTerm) -> bool:
        """The term's percentile is within its bound: at least `rank` of the population (the values and
        the failed requests' infinitely late ones, `num_late`) are within it; nothing to bound holds."""
        size = self.num_values + num_late(term.metric, self.num_values, self.num_ok, self.num_failed)
        return size == 0 or self.num_within >= rank(size, term.percentile)


@dataclass(frozen=True)
class SloTarget:
    """A named set of percentile bounds, all of which a run must meet."""

    name: str
    """As written, without spaces."""
    terms: tuple[SloTerm, ...]

    @property
    def label(self) -> str:
        return terms_label(self.terms)

    def values_s(self, results: pd.DataFrame) -> dict[str, float]:
        """Each term's percentile over `results` (one run's table, or several seeds' concatenated),
        seconds; inf when the requests that failed alone push it past every finite value."""
        return {t.name: percentile_s(results, t.metric, t.percentile) for t in self.terms}

    def ratios(self, results: pd.DataFrame) -> dict[str, float]:
        """Each term's value over its bound: > 1 misses it."""
        values = self.values_s(results)
        return {t.name: values[t.name] / t.bound_s for t in self.terms}

    def counts(self, results: pd.DataFrame) -> dict[str, TermCount]:
        """Each term's `TermCount` over `results`, by the term's text (`SloTerm.text`)."""
        return {t.text: term_count(results, t) for t in self.terms}

    def holds(self, counts: Mapping[str, TermCount]) -> bool:
        """Every term holds over the requests `counts` (as `counts` keys them) counted; none counted: no."""
        if not any(c.num_ok + c.num_failed for c in counts.values()):
            return False
        return all(counts[t.text].holds(t) for t in self.terms)

    def met(self, results: pd.DataFrame) -> bool:
        """`holds` over `results`: one run's table, or several seeds' concatenated."""
        return len(results) > 0 and self.holds(self.counts(results))

    def within_every_bound(self, results: pd.DataFrame) -> np.ndarray:
        """Per request: completed and within every term's bound on its own (itl: its p99 gap; NaN, e.g. a
        one-token answer's TPOT, within), the per-request view `workloads.slo` checks (`Slo.met`)."""
        met = results["ok"].to_numpy(dtype=bool).copy()
        for t in self.terms:
            values = results[COLUMNS[t.metric]].to_numpy(dtype=float)
            met &= np.isnan(values) | (values <= t.bound_s)
        return met

    def attainment(self, results: pd.DataFrame) -> float:
        """The share of requests `within_every_bound`, 0 without a request."""
        met = self.within_every_bound(results)
        return float(met.mean()) if len(met) else 0.0


def rank(size: int, percentile: float) -> int:
    """How many of a population of `size` must be at or below a value for it to be the `percentile`:
    ceil(size × percentile / 100), at least 1, in exact arithmetic on the percentile as written (a
    float's product can round up past a whole number)."""
    return max(1, math.ceil(size * Fraction(str(percentile)) / 100))


def num_late(metric: str, num_values: int, num_ok: int, num_failed: int) -> int:
    """The failed requests' infinitely late values in `metric`'s population: one each, or for itl as
    many late gaps as a completed request has on average."""
    if metric != "itl":
        return num_failed
    return num_failed * max(1, round(num_values / max(1, num_ok)))


def _completed_values(results: pd.DataFrame, metric: str) -> tuple[np.ndarray, int, int]:
    """`metric`'s values of the completed requests (none NaN), how many completed, how many not."""
    ok = results["ok"].to_numpy(dtype=bool)
    if metric == "itl":
        values = gaps([t for t in results.loc[ok, "token_times_s"] if len(t) > 1])
    else:
        values = results.loc[ok, _PER_REQUEST[metric]].to_numpy(dtype=float)
        values = values[~np.isnan(values)]
    return values, int(ok.sum()), int((~ok).sum())


def term_count(results: pd.DataFrame, term: SloTerm) -> TermCount:
    """`term`'s counts over a results table."""
    values, num_ok, num_failed = _completed_values(results, term.metric)
    return TermCount(int((values <= term.bound_s).sum()), len(values), num_ok, num_failed)


def percentile_s(results: pd.DataFrame, metric: str, percentile: float) -> float:
    """`metric`'s `percentile` over a results table (see the module's docstring): the `rank`-th smallest
    of its population; 0 with nothing to bound (e.g. tpot when every answer is one token)."""
    values, num_ok, num_failed = _completed_values(results, metric)
    size = len(values) + num_late(metric, len(values), num_ok, num_failed)
    if not size:
        return 0.0
    k = rank(size, percentile)
    return float(np.partition(values, k - 1)[k - 1]) if k <= len(values) else math.inf


def parse_slo_target(text: str) -> SloTarget:
    """`--slo`'s text: `workloads.slo`'s terms; one line naming what is wrong otherwise (SloError)."""
    return SloTarget(name=text.replace(" ", ""), terms=parse_terms(text, "--slo"))
