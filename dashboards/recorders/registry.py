"""An actor's registry of `dashboards.metrics` series, bound to its labels, and a bulk `observe`.

Counters and histograms carry prometheus_client's `_created` samples (the wall-clock time each series
was created), as vLLM 0.32's do: it never calls `disable_created_metrics()`. In the text format they
are gauges of their own (`vllm:prompt_tokens_created`), so no sum over a counter's or histogram's
samples meets them (`dashboards.exposition`).
"""

from __future__ import annotations

import bisect
import collections
import functools
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from dashboards.metrics import (
    TIME_SCALE,
    TOKENS_125,
    MetricSpec,
    buckets_125,
)  # fmt: skip

if TYPE_CHECKING:
    from emulation.config import TestbedConfig


class Registry:
    """A registry holding `specs`, each bound to one actor's common labels (extra labels stay open)."""

    def __init__(self, specs: tuple[MetricSpec, ...], cfg: TestbedConfig, role: str, replica: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        name = cfg.target.served_model_name or cfg.target.model
        self.labels = {"model_name": name, "engine": str(replica), "role": role, "replica": str(replica)}
        max_model_len = cfg.scheduler.max_model_len
        self._metrics: dict[str, Counter | Gauge | Histogram] = {}
        self._children: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        # Series without extra labels are exported at zero from the start, as vLLM's are: a rate of
        # "nothing happened" is 0, not missing data.
        for spec in specs:
            names = (*spec.common, *spec.labels)
            if spec.kind == "counter":
                metric: Counter | Gauge | Histogram = Counter(
                    spec.name, spec.doc, names, registry=self.registry
                )
            elif spec.kind == "gauge":
                metric = Gauge(spec.name, spec.doc, names, registry=self.registry)
            else:
                b = buckets_125(max_model_len) if spec.buckets == TOKENS_125 else spec.buckets
                assert isinstance(b, tuple)
                metric = Histogram(spec.name, spec.doc, names, buckets=b, registry=self.registry)
            self._metrics[spec.name] = metric
            if not spec.labels:
                self.child(spec)
        if TIME_SCALE in specs:
            self.child(TIME_SCALE).set(cfg.clock.scale if cfg.clock.mode == "live" else 1.0)

    def child(self, spec: MetricSpec, **extra: str) -> Any:
        """The series of `spec` for this actor (and `extra` label values); created at zero if new.

        Cached: prometheus_client's `labels()` lookup costs more than the observation itself.
        """
        key = (spec.name, tuple(extra.items()))
        series = self._children.get(key)
        if series is None:
            common = {k: self.labels[k] for k in spec.common}
            series = self._children[key] = self._metrics[spec.name].labels(**common, **extra)
        return series

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()


def observe_many(histogram: Histogram, values: Sequence[float]) -> None:
    """`histogram.observe(v)` for each of `values`, one increment a bucket: prometheus_client has no
    bulk observe, so this adds to the same bucket and sum values `observe` adds to, the sum one value
    at a time (the same bits as observing each)."""
    if len(values) <= 1:  # none, or one: observed as itself (cheaper than counting)
        for v in values:
            histogram.observe(v)
        return
    bounds = histogram._upper_bounds  # each value's bucket: the first bound >= it (`amount <= bound`)
    if len(values) > 64:  # (numpy's per-call cost outweighs its loop below that)
        counts = dict(enumerate(np.bincount(np.searchsorted(bounds, values), minlength=len(bounds))))
    else:
        counts = collections.Counter(map(functools.partial(bisect.bisect_left, bounds), values))
    add_each(histogram._sum, values)
    for i, n in counts.items():
        if n:
            histogram._buckets[i].inc(int(n))


def add_each(value: Any, amounts: Sequence[float]) -> None:
    """Add `amounts` to a prometheus_client value one at a time, in order, as an `inc` each would (so
    a window's steps add up to the bits its steps one at a time do); recorders run on their actor's
    loop only, so nothing writes the value between its get and set."""
    value.set(functools.reduce(operator.add, amounts, value.get()))
