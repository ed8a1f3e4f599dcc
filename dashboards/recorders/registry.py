"""An actor's registry of `dashboards.metrics` series, bound to its labels.

The hooks write to plain running values (`Total`, `Level`, `Observed`), copied into prometheus_client's
series whenever the registry is collected (a scrape, an exposition): prometheus_client takes a lock
and checks its arguments at every `inc` and `observe`, which in a virtual replay of a trace, hundreds
of thousands of them, cost more than the events they record. The running values add up exactly as
prometheus_client's own would (the same float additions, in the same order), so the exposition is the
same to the bit.

Counters and histograms carry prometheus_client's `_created` samples (the wall-clock time each series
was created), as vLLM 0.32's do: it never calls `disable_created_metrics()`. In the text format they
are gauges of their own (`vllm:prompt_tokens_created`), so no sum over a counter's or histogram's
samples meets them (`dashboards.exposition`).
"""

from __future__ import annotations

import bisect
import functools
import operator
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from dashboards.metrics import (
    TIME_SCALE,
    TOKENS_125,
    MetricSpec,
    buckets_125,
)  # fmt: skip

if TYPE_CHECKING:
    from emulation.config import TestbedConfig


class Total:
    """A counter series' running total: `inc` adds as prometheus_client's `Counter.inc` does."""

    __slots__ = ("series", "value")

    def __init__(self, series: Any) -> None:
        self.series = series
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount

    def add_each(self, amounts: Iterable[float]) -> None:
        """`inc` each of `amounts`, in order."""
        self.value = functools.reduce(operator.add, amounts, self.value)

    def sync(self) -> None:
        self.series._value.set(self.value)


class Level:
    """A gauge series' value."""

    __slots__ = ("series", "value")

    def __init__(self, series: Any) -> None:
        self.series = series
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = value

    def sync(self) -> None:
        self.series._value.set(float(self.value))


class Observed:
    """A histogram series' bucket counts and sum: `observe` counts a value in the first bucket whose
    bound is at least it (a NaN in none) and adds it to the sum, as prometheus_client's does."""

    __slots__ = ("bounds", "counts", "series", "sum")

    def __init__(self, series: Any) -> None:
        self.series = series
        self.bounds: list[float] = list(series._upper_bounds)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.sum += amount
        if amount == amount:  # (not NaN)
            self.counts[bisect.bisect_left(self.bounds, amount)] += 1

    def observe_many(self, values: Sequence[float]) -> None:
        """`observe` each of `values`, in order: the sum one value at a time (the same bits), the
        buckets counted at once."""
        if len(values) > 64:  # (numpy's per-call cost outweighs its loop below that)
            more = np.bincount(np.searchsorted(self.bounds, values), minlength=len(self.bounds)).tolist()
            self.counts = list(map(operator.add, self.counts, more))
            self.sum = functools.reduce(operator.add, values, self.sum)
        else:
            bounds, tally, total = self.bounds, self.counts, self.sum
            for v in values:
                total += v
                if v == v:  # (not NaN)
                    tally[bisect.bisect_left(bounds, v)] += 1
            self.sum = total

    def sync(self) -> None:
        self.series._sum.set(self.sum)
        for bucket, n in zip(self.series._buckets, self.counts, strict=True):
            bucket.set(float(n))


class _SyncedRegistry(CollectorRegistry):
    """A CollectorRegistry that copies its running values into their series before each collection
    (whole, or of some families: a scrape's `name[]`). Live, an actor's loop and its metrics thread
    may collect at once: one copy at a time, so that no series is set back to an older value."""

    def __init__(self, running: dict[Any, Total | Level | Observed]) -> None:
        super().__init__(auto_describe=True)
        self._running = running
        self._syncing = threading.Lock()

    def sync(self) -> None:
        with self._syncing:
            for value in list(self._running.values()):
                value.sync()

    def collect(self) -> Iterable[Metric]:
        self.sync()
        yield from super().collect()

    def restricted_registry(self, names: Iterable[str]) -> Any:
        self.sync()
        return super().restricted_registry(names)


class Registry:
    """A registry holding `specs`, each bound to one actor's common labels (extra labels stay open)."""

    def __init__(self, specs: tuple[MetricSpec, ...], cfg: TestbedConfig, role: str, replica: int) -> None:
        self._children: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        self._plain: dict[str, Any] = {}
        """The series without extra labels, by name."""
        self.registry: CollectorRegistry = _SyncedRegistry(self._children)
        name = cfg.target.served_model_name or cfg.target.model
        self.labels = {"model_name": name, "engine": str(replica), "role": role, "replica": str(replica)}
        max_model_len = cfg.scheduler.max_model_len
        self._metrics: dict[str, Counter | Gauge | Histogram] = {}
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
        """The running value of `spec`'s series for this actor (and `extra` label values): a `Total`,
        `Level` or `Observed`; the series is created at zero if new."""
        if not extra and (running := self._plain.get(spec.name)) is not None:  # (most hooks' case)
            return running
        key = (spec.name, tuple(sorted(extra.items())))  # (one series whatever the labels' order)
        running = self._children.get(key)
        if running is None:
            common = {k: self.labels[k] for k in spec.common}
            series = self._metrics[spec.name].labels(**common, **extra)
            kind = {"counter": Total, "gauge": Level}.get(spec.kind, Observed)
            running = self._children[key] = kind(series)
            if not extra:
                self._plain[spec.name] = running
        return running

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()
