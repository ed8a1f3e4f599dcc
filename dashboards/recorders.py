"""The recorders: each actor's registry of `dashboards.metrics` series, and the `on_<event>` hooks that are
the only way code records into it (engines, the proxy, render replicas).

Each actor owns a registry: a live actor serves it at `/metrics`, `testbed serve` merges those of its
in-process roles, and every run writes the final exposition beside its results.
"""

from __future__ import annotations

import bisect
import collections
import functools
import math
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from dashboards.metrics import (
    BUSY,
    CLIENT_E2E,
    CLIENT_TTFT,
    COMMON_LABELS,
    DECODE_TIME,
    E2E,
    EC_TRANSFER,
    ENCODE,
    ENCODER_JOBS_WAITING,
    ENCODER_SERIES,
    ENCODER_STEP_TOKENS,
    ENGINE_SERIES,
    FINISHED_REASONS,
    GENERATION_TOKENS,
    INFERENCE_TIME,
    ITERATION_TOKENS,
    ITL,
    KV_CACHE_USAGE,
    KV_CONVERSATION_BLOCKS,
    KV_HANDOFF,
    KV_HANDOFF_PARTS,
    KV_HELD_BLOCKS,
    KV_PULL_BACK_FAILED,
    LAGGED_KV_TRANSFERS,
    LAGGED_STEPS,
    MAX_GAP,
    MAX_OVERRUN,
    MM_CACHE_HITS,
    MM_CACHE_QUERIES,
    NIXL_BYTES,
    NIXL_DESCRIPTORS,
    NIXL_FAILED_NOTIFICATIONS,
    NIXL_FAILED_TRANSFERS,
    NIXL_KV_EXPIRED,
    NIXL_POST_TIME,
    NIXL_XFER_TIME,
    NUM_PREEMPTIONS,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    PREFILL_TIME,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    PROMPT_TOKENS,
    PROMPT_TOKENS_BY_SOURCE,
    PROXY_SERIES,
    QUEUE_TIME,
    RENDER_CALLS,
    RENDER_CPU,
    RENDER_SERIES,
    RENDER_TOKENS,
    REQUEST_GENERATION_TOKENS,
    REQUEST_MAX_GENERATION_TOKENS,
    REQUEST_MAX_TOKENS,
    REQUEST_PREFILL_KV_COMPUTED,
    REQUEST_PROMPT_TOKENS,
    REQUEST_SUCCESS,
    REQUESTS_FINISHED,
    ROUTED,
    ROUTED_OVERLAP_BLOCKS,
    ROUTED_PROMPT_BLOCKS,
    SESSION_TTFT,
    SESSIONS_ACTIVE,
    SLO_MET,
    STEP_CPU,
    STEPS,
    TIME_SCALE,
    TOKENS_125,
    TPOT,
    TTFT,
    TURN_BUCKETS,
    WORST_GAP,
    MetricSpec,
    buckets_125,
)  # fmt: skip
from emulation.profiles import MODELS
from messages.stats import EncoderStats, SchedulerStats
from workloads.latency import HANDOFF_PARTS, handoff_parts, request_latencies

if TYPE_CHECKING:
    from emulation.config import TestbedConfig
    from messages import RequestResult, RequestTimes

disable_created_metrics()  # vLLM exports no `_created` series


class _Registry:
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
            names = (*COMMON_LABELS, *spec.labels)
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
            series = self._children[key] = self._metrics[spec.name].labels(**self.labels, **extra)
        return series

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()


class EngineMetrics(_Registry):
    """An engine's series. The engine calls the hooks; nothing else writes to the registry."""

    def __init__(self, cfg: TestbedConfig, role: str, replica: int) -> None:
        super().__init__(ENGINE_SERIES, cfg, role, replica)
        self._num_layers = MODELS[cfg.target.model].num_layers
        self._link = cfg.kv_transfer.link
        self._direction = "d2p" if role == "prefill" else "p2d"  # who pulls: prefill only pulls back
        for reason in FINISHED_REASONS:
            self.child(REQUEST_SUCCESS, finished_reason=reason)
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            self.child(PROMPT_TOKENS_BY_SOURCE, source=source)
        self._counted = SchedulerStats(0, 0, 0.0, 0, 0, 0, 0)
        """The state last recorded: its totals are already counted."""
        self._ttft = self.child(TTFT)
        self._itl = self.child(ITL)
        self._gen = self.child(GENERATION_TOKENS)
        held = KV_CONVERSATION_BLOCKS if role == "decode" else KV_HELD_BLOCKS  # what holds blocks there
        self._state = [
            self.child(s) for s in (held, NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING, KV_CACHE_USAGE)
        ]

    def on_steps(
        self, step_s: Sequence[float], num_scheduled_tokens: Sequence[int], cpu_s: Sequence[float]
    ) -> None:
        """After steps of `num_scheduled_tokens` (their outputs stamped); `cpu_s` of each `step_s`
        was CPU work."""
        observe_many(self.child(ITERATION_TOKENS), num_scheduled_tokens)
        self.child(STEPS).inc(len(step_s))
        _add_each(self.child(BUSY)._value, step_s)
        _add_each(self.child(STEP_CPU)._value, cpu_s)

    def on_state(self, stats: SchedulerStats) -> None:
        """Gauges, and the counters the scheduler, block manager and encoder cache keep as totals (at
        steps and on arrivals)."""
        held, running, waiting, usage = self._state
        held.set(stats.num_kv_held_blocks)
        running.set(stats.num_running_reqs)
        waiting.set(stats.num_waiting_reqs)
        usage.set(stats.kv_cache_usage)
        was = self._counted
        if stats.num_prefix_cache_queries != was.num_prefix_cache_queries:
            self.child(PREFIX_CACHE_QUERIES).inc(
                stats.num_prefix_cache_queries - was.num_prefix_cache_queries
            )
            self.child(PREFIX_CACHE_HITS).inc(stats.num_prefix_cache_hits - was.num_prefix_cache_hits)
        if stats.num_preemptions != was.num_preemptions:
            self.child(NUM_PREEMPTIONS).inc(stats.num_preemptions - was.num_preemptions)
        if stats.num_mm_cache_queries != was.num_mm_cache_queries:
            self.child(MM_CACHE_QUERIES).inc(stats.num_mm_cache_queries - was.num_mm_cache_queries)
            self.child(MM_CACHE_HITS).inc(stats.num_mm_cache_hits - was.num_mm_cache_hits)
        self._counted = stats

    def on_first_token(
        self, ttft_s: float, num_prompt_tokens: int, num_cached_tokens: int, num_external_tokens: int
    ) -> None:
        """A request's first token (engine-level TTFT counts from entering the engine's queue)."""
        self._ttft.observe(ttft_s)
        computed = num_prompt_tokens - num_cached_tokens - num_external_tokens
        self.child(PROMPT_TOKENS).inc(num_prompt_tokens)
        self.child(PROMPT_TOKENS_BY_SOURCE, source="local_compute").inc(computed)
        self.child(PROMPT_TOKENS_BY_SOURCE, source="local_cache_hit").inc(num_cached_tokens)
        self.child(PROMPT_TOKENS_BY_SOURCE, source="external_kv_transfer").inc(num_external_tokens)
        self._gen.inc()

    def on_next_tokens(self, itls_s: Sequence[float]) -> None:
        observe_many(self._itl, itls_s)
        self._gen.inc(len(itls_s))

    def on_request_finished(
        self,
        reason: str,
        times: RequestTimes,
        num_prompt_tokens: int,
        num_output_tokens: int,
        max_tokens: int,
        num_external_tokens: int,
    ) -> None:
        """A request ended (its times complete): per-request histograms, as vLLM records them at finish."""
        t = times
        n_out = num_output_tokens
        assert t.finished_s is not None
        self.child(REQUEST_SUCCESS, finished_reason=reason).inc()
        self.child(E2E).observe(t.finished_s - t.queued_s)
        self.child(REQUEST_PROMPT_TOKENS).observe(num_prompt_tokens)
        self.child(REQUEST_GENERATION_TOKENS).observe(n_out)
        self.child(REQUEST_MAX_TOKENS).observe(max_tokens)
        self.child(REQUEST_MAX_GENERATION_TOKENS).observe(n_out)
        if t.scheduled_s is not None:
            self.child(QUEUE_TIME).observe(t.scheduled_s - t.queued_s)
            computed = num_prompt_tokens - t.num_cached_tokens - num_external_tokens
            self.child(REQUEST_PREFILL_KV_COMPUTED).observe(computed)
        if t.first_token_s is not None and t.last_token_s is not None:
            if t.scheduled_s is not None:
                self.child(PREFILL_TIME).observe(t.first_token_s - t.scheduled_s)
                self.child(INFERENCE_TIME).observe(t.last_token_s - t.scheduled_s)
            self.child(DECODE_TIME).observe(t.last_token_s - t.first_token_s)
            if n_out > 1:
                self.child(TPOT).observe((t.last_token_s - t.first_token_s) / (n_out - 1))

    def on_kv_transfer_done(self, xfer_s: float, post_s: float, kv_bytes: int, num_blocks: int) -> None:
        """Decode side, pull mode: the prompt KV arrived. Descriptors: one per block, layer, K and V."""
        self.child(NIXL_XFER_TIME).observe(xfer_s)
        self.child(NIXL_POST_TIME).observe(post_s)
        self.child(NIXL_BYTES).observe(kv_bytes)
        self.child(NIXL_DESCRIPTORS).observe(num_blocks * self._num_layers * 2)
        self.child(KV_HANDOFF, link=self._link, direction=self._direction).observe(xfer_s)

    def on_lag(self, what: str, max_overrun_s: float) -> None:
        """A step or KV transfer overran its emulated budget; `max_overrun_s`: the worst so far."""
        self.child(LAGGED_STEPS if what == "step" else LAGGED_KV_TRANSFERS).inc()
        self.child(MAX_OVERRUN).set(max_overrun_s)

    def on_kv_transfer_failed(self) -> None:
        self.child(NIXL_FAILED_TRANSFERS).inc()

    def on_kv_pull_back_failed(self) -> None:
        self.child(KV_PULL_BACK_FAILED).inc()

    def on_kv_notification_failed(self) -> None:
        """The prefill side could not be told to release the KV (it died)."""
        self.child(NIXL_FAILED_NOTIFICATIONS).inc()

    def on_kv_expired(self, num_requests: int) -> None:
        """Prefill side: held KV released because no decode engine pulled it in time."""
        self.child(NIXL_KV_EXPIRED).inc(num_requests)


class ProxyMetrics(_Registry):
    """The client's view: latency through every role, the worst stall, SLO attainment and goodput."""

    def __init__(self, cfg: TestbedConfig, replica: int = 0) -> None:
        from workloads.slo import parse_slo

        super().__init__(PROXY_SERIES, cfg, "proxy", replica)
        self._slos = [parse_slo(s) for s in cfg.slos]
        self._slos_read_p99 = any(m == "itl" for slo in self._slos for m, _ in slo.bounds_s)  # p99_itl_s
        for reason in FINISHED_REASONS:
            self.child(REQUESTS_FINISHED, finished_reason=reason)
        for slo in self._slos:
            self.child(SLO_MET, slo=slo.name)
        for part in HANDOFF_PARTS:
            self.child(KV_HANDOFF_PARTS, part=part)
        for turn in TURN_BUCKETS:
            self.child(SESSION_TTFT, turn=turn)
        self._worst_gap_s = 0.0
        self._sessions: dict[str, int] = {}
        """session id -> its requests in flight"""

    def on_routed(self, pool: str, engine_id: str, overlap_blocks: int, prompt_blocks: int) -> None:
        """A pool's router chose `engine_id`, which held `overlap_blocks` of the prompt's blocks."""
        self.child(ROUTED, pool=pool, routed_to=engine_id).inc()
        self.child(ROUTED_PROMPT_BLOCKS, pool=pool).inc(prompt_blocks)
        self.child(ROUTED_OVERLAP_BLOCKS, pool=pool).inc(overlap_blocks)

    def on_request_start(self, result: RequestResult) -> None:
        """The proxy took a request (its result so far: ids and session)."""
        if result.session_id is not None:
            self._sessions[result.session_id] = self._sessions.get(result.session_id, 0) + 1
            self.child(SESSIONS_ACTIVE).set(len(self._sessions))

    def _session_done(self, result: RequestResult, ttft_s: float) -> None:
        sid = result.session_id
        if sid is None:
            return
        left = self._sessions.get(sid, 1) - 1
        if left > 0:
            self._sessions[sid] = left
        else:
            self._sessions.pop(sid, None)
        self.child(SESSIONS_ACTIVE).set(len(self._sessions))
        if result.turn is not None and not math.isnan(ttft_s):
            self.child(SESSION_TTFT, turn=turn_bucket(result.turn)).observe(ttft_s)

    def on_request_done(self, result: RequestResult) -> None:
        """The proxy finished `result` (any outcome); the same figures as its row of the results table."""
        lat = request_latencies(result.arrival_s, result.token_times_s, p99=self._slos_read_p99)
        ok = result.finished_reason in ("length", "stop")
        self.child(REQUESTS_FINISHED, finished_reason=result.finished_reason or "error").inc()
        if not math.isnan(lat["ttft_s"]):
            self.child(CLIENT_TTFT).observe(lat["ttft_s"])
            self.child(CLIENT_E2E).observe(lat["e2el_s"])
        if not math.isnan(lat["max_gap_s"]):
            self.child(MAX_GAP).observe(lat["max_gap_s"])
            self._worst_gap_s = max(self._worst_gap_s, lat["max_gap_s"])
            self.child(WORST_GAP).set(self._worst_gap_s)
        for slo in self._slos:
            if slo.met(ok, lat):
                self.child(SLO_MET, slo=slo.name).inc()
        parts = handoff_parts(result.prefill_done_s, result.times)
        for part, seconds in (parts or {}).items():
            self.child(KV_HANDOFF_PARTS, part=part).observe(seconds)
        if result.encode_s > 0:
            self.child(ENCODE).observe(result.encode_s)
            self.child(EC_TRANSFER).observe(result.ec_transfer_s)
        self._session_done(result, lat["ttft_s"])


def turn_bucket(turn: int) -> str:
    """The `turn` label of a 0-based turn index (`TURN_BUCKETS`)."""
    n = turn + 1
    if n <= 2:
        return str(n)
    for bucket in TURN_BUCKETS[2:-1]:
        if n <= int(bucket.split("-")[1]):
            return bucket
    return TURN_BUCKETS[-1]


class RenderMetrics(_Registry):
    """A render replica's series; `on_render` is the Render role's hook."""

    def __init__(self, cfg: TestbedConfig, replica: int) -> None:
        super().__init__(RENDER_SERIES, cfg, "render", replica)
        for op in ("render", "derender", "image"):
            for spec in RENDER_SERIES:
                self.child(spec, op=op)

    def on_render(self, op: str, cpu_s: float, num_tokens: int) -> None:
        """One render (op='render'), derender (op='derender') or image (op='image': decode, resize,
        hash; its visual tokens) took `cpu_s` of this thread's CPU."""
        self.child(RENDER_CPU, op=op).inc(cpu_s)
        self.child(RENDER_TOKENS, op=op).inc(num_tokens)
        self.child(RENDER_CALLS, op=op).inc()


class EncoderMetrics(_Registry):
    """An encoder replica's series (E/P/D); the encoder calls the hooks."""

    def __init__(self, cfg: TestbedConfig, replica: int) -> None:
        super().__init__(ENCODER_SERIES, cfg, "encoder", replica)

    def on_encoder_step(self, num_visual_tokens: int, stats: EncoderStats) -> None:
        self.child(ENCODER_STEP_TOKENS).observe(num_visual_tokens)
        self._set_totals(stats)

    def on_encoder_state(self, num_waiting: int) -> None:
        self.child(ENCODER_JOBS_WAITING).set(num_waiting)

    def on_encoder_lookup(self, stats: EncoderStats) -> None:
        """A job's image looked up in the encoder's cache."""
        self._set_totals(stats)

    def _set_totals(self, stats: EncoderStats) -> None:
        """The counters, set to the encoder's own totals (the values the run's summary reads)."""
        self.child(STEPS)._value.set(float(stats.num_steps))
        self.child(BUSY)._value.set(stats.busy_s)
        self.child(MM_CACHE_QUERIES)._value.set(float(stats.num_mm_cache_queries))
        self.child(MM_CACHE_HITS)._value.set(float(stats.num_mm_cache_hits))


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
    _add_each(histogram._sum, values)
    for i, n in counts.items():
        if n:
            histogram._buckets[i].inc(int(n))


def _add_each(value: Any, amounts: Sequence[float]) -> None:
    """Add `amounts` to a prometheus_client value one at a time, in order, as an `inc` each would (so
    a window's steps add up to the bits its steps one at a time do); recorders run on their actor's
    loop only, so nothing writes the value between its get and set."""
    value.set(functools.reduce(operator.add, amounts, value.get()))
