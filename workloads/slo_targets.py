"""SLO targets with percentiles, as a capacity plan states them: `ttft:p90<=2s,tpot:p90<=50ms`, in
`workloads.slo`'s grammar (a term without a percentile, `ttft<=2s`, bounds the p90).

A target holds when every term's percentile over a run's requests is within its bound. Unlike
`workloads.slo` (each request checked against bounds, the share that meets them reported), a target
is one yes or no per run, the question a design search asks at each offered load: "does this design
keep p90 TTFT under 2 s at 1.5 req/s?"

What each metric's percentile is taken over (a request that failed or was rejected counts as an
infinitely late one, so that a design cannot meet a target by dropping requests):

    ttft, tpot, e2el  one value per request (the results table's `ttft_s`, `tpot_s`, `e2el_s`;
                      a one-token answer has no TPOT and is left out of tpot)
    gap               one value per request: its worst inter-token gap (`max_gap_s`)
    itl               every inter-token gap of every request, pooled (vLLM's bench ITL percentiles;
                      a failed request counts as many late gaps as a completed one has on average)

Percentiles are numpy's `inverted_cdf`, the smallest value with at least that share of the
population at or below it, not the interpolated ones of `testbed run`'s summary: a p90 target holds
exactly when at least 90 % are within it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from workloads.slo import COLUMNS, SloTerm, parse_terms
from workloads.summary import gaps

_PER_REQUEST = {m: c for m, c in COLUMNS.items() if m != "itl"}
"""The results-table column of each metric taken once per request."""


@dataclass(frozen=True)
class SloTarget:
    """A named set of percentile bounds, all of which a run must meet."""

    name: str
    """As written, without spaces."""
    terms: tuple[SloTerm, ...]

    @property
    def label(self) -> str:
        """`TTFT p90 ≤ 2 s and TPOT p90 ≤ 50 ms`: every term with its percentile."""
        return " and ".join(t.label for t in self.terms)

    def values_s(self, results: pd.DataFrame) -> dict[str, float]:
        """Each term's percentile over `results` (one run's table, or several seeds' concatenated),
        seconds; inf when the requests that failed alone push it past every finite value."""
        return {t.name: percentile_s(results, t.metric, t.percentile) for t in self.terms}

    def ratios(self, results: pd.DataFrame) -> dict[str, float]:
        """Each term's value over its bound: > 1 misses it."""
        values = self.values_s(results)
        return {t.name: values[t.name] / t.bound_s for t in self.terms}

    def met(self, results: pd.DataFrame) -> bool:
        return len(results) > 0 and all(r <= 1.0 for r in self.ratios(results).values())

    def attainment(self, results: pd.DataFrame) -> float:
        """The share of requests within every term's bound on their own (itl: the request's p99
        gap), failed ones not: the per-request view `workloads.slo` reports for SLO sets."""
        met = results["ok"].to_numpy(dtype=bool).copy()
        for t in self.terms:
            values = results[COLUMNS[t.metric]].to_numpy(dtype=float)
            met &= np.isnan(values) | (values <= t.bound_s)
        return float(met.mean()) if len(met) else 0.0


def percentile_s(results: pd.DataFrame, metric: str, percentile: float) -> float:
    """`metric`'s `percentile` over a results table (see the module's docstring), the smallest value
    with at least that share of the population at or below it (numpy's `inverted_cdf`)."""
    ok = results["ok"].to_numpy(dtype=bool)
    num_failed = int((~ok).sum())
    if metric == "itl":
        values = gaps([t for t in results.loc[ok, "token_times_s"] if len(t) > 1])
        # a failed request stands for as many late gaps as a completed one has, on average
        num_late = num_failed * max(1, round(len(values) / max(1, int(ok.sum()))))
    else:
        values = results.loc[ok, _PER_REQUEST[metric]].to_numpy(dtype=float)
        values, num_late = values[~np.isnan(values)], num_failed
    population = np.concatenate([values, np.full(num_late, math.inf)])
    if not len(population):
        return 0.0  # nothing to bound (e.g. tpot when every answer is one token)
    return float(np.percentile(population, percentile, method="inverted_cdf"))


def parse_slo_target(text: str) -> SloTarget:
    """`--slo`'s text: `workloads.slo`'s terms; one line naming what is wrong otherwise (SloError)."""
    return SloTarget(name=text.replace(" ", ""), terms=parse_terms(text, "--slo"))
