"""An engine's recorder: the `EngineRecorder` hooks over vLLM's engine series."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dashboards.metrics import (
    BUSY,
    DECODE_TIME,
    E2E,
    ENGINE_SERIES,
    FINISHED_REASONS,
    GENERATION_TOKENS,
    INFERENCE_TIME,
    ITERATION_TOKENS,
    ITL,
    KV_CACHE_USAGE,
    KV_CONVERSATION_BLOCKS,
    KV_HANDOFF,
    KV_HELD_BLOCKS,
    KV_PULL_BACK_FAILED,
    LAGGED_KV_TRANSFERS,
    LAGGED_STEPS,
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
    QUEUE_TIME,
    REQUEST_GENERATION_TOKENS,
    REQUEST_MAX_GENERATION_TOKENS,
    REQUEST_MAX_TOKENS,
    REQUEST_PREFILL_KV_COMPUTED,
    REQUEST_PROMPT_TOKENS,
    REQUEST_SUCCESS,
    STEP_CPU,
    STEPS,
    TPOT,
    TTFT,
)  # fmt: skip
from dashboards.recorders.registry import Registry, add_each, observe_many
from emulation.profiles import MODELS
from messages.stats import SchedulerStats

if TYPE_CHECKING:
    from emulation.config import TestbedConfig
    from messages import RequestTimes


class EngineMetrics(Registry):
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
        add_each(self.child(BUSY)._value, step_s)
        add_each(self.child(STEP_CPU)._value, cpu_s)

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
