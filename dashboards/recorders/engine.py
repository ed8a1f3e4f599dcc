"""An engine's recorder: the `EngineRecorder` hooks over vLLM's engine series."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dashboards.metrics import (
    ADMISSION_REASONS,
    ADMISSION_REJECTIONS,
    AFD_BUBBLE,
    AFD_EXPOSED,
    AFD_FFN_UTILIZATION,
    AFD_TRANSFER_BYTES,
    BUSY,
    CACHE_CONFIG_INFO,
    CACHED_SOURCES,
    DECODE_TIME,
    E2E,
    ENGINE_SERIES,
    ENGINE_SLEEP_STATE,
    ESTIMATED_FLOPS,
    ESTIMATED_READ_BYTES,
    ESTIMATED_WRITE_BYTES,
    EXTERNAL_PREFIX_CACHE_HITS,
    EXTERNAL_PREFIX_CACHE_QUERIES,
    FINISHED_REASONS,
    GENERATION_TOKENS,
    HYBRID_SERIES,
    INFERENCE_TIME,
    ITERATION_TOKENS,
    ITL,
    KV_CACHE_USAGE,
    KV_CONVERSATION_BLOCKS,
    KV_HANDOFF,
    KV_HELD_BLOCKS,
    KV_OFFLOAD_LOAD_BYTES,
    KV_OFFLOAD_LOAD_SIZE,
    KV_OFFLOAD_LOAD_TIME,
    KV_OFFLOAD_STORE_BYTES,
    KV_OFFLOAD_STORE_SIZE,
    KV_OFFLOAD_STORE_TIME,
    KV_OFFLOAD_TIER_EVICTED,
    KV_OFFLOAD_TIER_FULL,
    KV_OFFLOAD_TIER_USAGE,
    KV_PULL_BACK_FAILED,
    KV_TRANSFER_STATE_BYTES,
    LAGGED_KV_TRANSFERS,
    LAGGED_STEPS,
    MAX_OVERRUN,
    MM_CACHE_HITS,
    MM_CACHE_QUERIES,
    MOE_ALL_TO_ALL,
    MOE_DBO_HIDDEN,
    MOE_EP_IMBALANCE,
    MOE_MAX_TOKENS_PER_EXPERT,
    MOE_MEAN_TOKENS_PER_EXPERT,
    MOE_SERIES,
    NIXL_AFTER_EXPIRY,
    NIXL_BYTES,
    NIXL_DESCRIPTORS,
    NIXL_FAILED_NOTIFICATIONS,
    NIXL_FAILED_TRANSFERS,
    NIXL_KV_EXPIRED,
    NIXL_POST_TIME,
    NIXL_XFER_TIME,
    NUM_PREEMPTIONS,
    NUM_REQUESTS_KV_FETCH,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    NUM_REQUESTS_WAITING_BY_REASON,
    OFFLOAD_SERIES,
    PREFILL_TIME,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    PROMPT_SOURCES,
    PROMPT_TOKENS,
    PROMPT_TOKENS_BY_SOURCE,
    PROMPT_TOKENS_CACHED,
    PROMPT_TOKENS_CACHED_BY_SOURCE,
    QUEUE_TIME,
    REQUEST_GENERATION_TOKENS,
    REQUEST_MAX_GENERATION_TOKENS,
    REQUEST_MAX_TOKENS,
    REQUEST_NUM_PREEMPTIONS,
    REQUEST_PARAMS_N,
    REQUEST_PREFILL_KV_COMPUTED,
    REQUEST_PROMPT_TOKENS,
    REQUEST_SUCCESS,
    SLEEP_STATES,
    STEP_CPU,
    STEPS,
    TPOT,
    TTFT,
    WAITING_REASONS,
)  # fmt: skip
from dashboards.recorders.cache_config import cache_config_info
from dashboards.recorders.registry import Registry
from messages.moe_steps import MoeWork
from messages.stats import KV_FETCH_STAGES, SchedulerStats, StepWork

if TYPE_CHECKING:
    from emulation.config import TestbedConfig
    from messages import RequestTimes


class EngineMetrics(Registry):
    """An engine's series. The engine calls the hooks; nothing else writes to the registry."""

    def __init__(self, cfg: TestbedConfig, role: str, replica: int) -> None:
        model = cfg.target.profile
        series = ENGINE_SERIES + (MOE_SERIES if model.moe is not None else ())
        series += HYBRID_SERIES if model.ssm is not None else ()
        super().__init__(
            series + (OFFLOAD_SERIES if cfg.kv_offload.for_role(role) else ()), cfg, role, replica
        )
        self._num_layers = model.num_attention_layers  # (KV descriptors: the layers holding KV)
        self._link = cfg.kv_transfer.link
        self._direction = "d2p" if role == "prefill" else "p2d"  # who pulls: prefill only pulls back
        self._connector = role in ("prefill", "decode") or cfg.kv_offload.for_role(role)
        """A KV connector queries for external KV (P/D instances run one: NIXL, kv_both; so do engines
        with offload tiers: the offloading connector)."""
        for spec, values in (
            (REQUEST_SUCCESS, {"finished_reason": FINISHED_REASONS}),
            (PROMPT_TOKENS_BY_SOURCE, {"source": PROMPT_SOURCES}),
            (PROMPT_TOKENS_CACHED_BY_SOURCE, {"source": CACHED_SOURCES}),
            (NUM_REQUESTS_WAITING_BY_REASON, {"reason": WAITING_REASONS}),
            (NUM_REQUESTS_KV_FETCH, {"stage": KV_FETCH_STAGES}),
            (ADMISSION_REJECTIONS, {"reason": ADMISSION_REASONS}),
            (ENGINE_SLEEP_STATE, {"sleep_state": SLEEP_STATES}),
        ):
            ((label, names),) = values.items()
            for name in names:
                self.child(spec, **{label: name})
        if getattr(cfg.pools, role).afd is not None:  # an AFD engine's labelled series at zero, too
            for direction in ("a2f", "f2a"):
                self.child(AFD_TRANSFER_BYTES, direction=direction)
            for side in ("attention", "ffn"):
                self.child(AFD_BUBBLE, side=side)
        o = cfg.kv_offload
        for tier in [t for t, gb in (("host", o.host_gb), ("disk", o.disk_gb)) if gb and o.for_role(role)]:
            for spec in (KV_OFFLOAD_TIER_USAGE, KV_OFFLOAD_TIER_EVICTED, KV_OFFLOAD_TIER_FULL):
                self.child(spec, tier=tier)  # its own tiers' series at zero, too
        self.child(ENGINE_SLEEP_STATE, sleep_state="awake").set(1)  # engines never sleep
        self.child(CACHE_CONFIG_INFO, **cache_config_info(cfg, role)).set(1)
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
        self,
        step_s: Sequence[float],
        num_scheduled_tokens: Sequence[int],
        cpu_s: Sequence[float],
        work: StepWork,
    ) -> None:
        """After steps of `num_scheduled_tokens` (their outputs stamped); `cpu_s` of each `step_s`
        was CPU work; `work`, the steps' on each GPU (vLLM's MFU estimate)."""
        self.child(ITERATION_TOKENS).observe_many(num_scheduled_tokens)
        self.child(STEPS).inc(len(step_s))
        self.child(BUSY).add_each(step_s)
        self.child(STEP_CPU).add_each(cpu_s)
        for spec, amounts in (
            (ESTIMATED_FLOPS, work.flops),
            (ESTIMATED_READ_BYTES, work.read_bytes),
            (ESTIMATED_WRITE_BYTES, work.write_bytes),
        ):
            if amounts:
                self.child(spec).add_each(amounts)
        if work.moe is not None:
            self._on_moe_steps(work.moe)

    def _on_moe_steps(self, moe: MoeWork) -> None:
        """MoE targets: each step's expert load, imbalance and all-to-alls; what overlap hid."""
        for spec, values in (
            (MOE_MAX_TOKENS_PER_EXPERT, moe.max_tokens_per_expert),
            (MOE_MEAN_TOKENS_PER_EXPERT, moe.mean_tokens_per_expert),
            (MOE_EP_IMBALANCE, moe.imbalance),
            (MOE_ALL_TO_ALL, moe.all_to_all_s),
        ):
            self.child(spec).observe_many(values)
        self.child(MOE_DBO_HIDDEN).add_each(moe.overlap_s)
        if any(moe.a2f_bytes):
            self._on_afd_steps(moe)

    def _on_afd_steps(self, moe: MoeWork) -> None:
        """Attention-FFN disaggregation: the bytes across the cut, what they exposed, the bubbles."""
        self.child(AFD_TRANSFER_BYTES, direction="a2f").add_each(moe.a2f_bytes)
        self.child(AFD_TRANSFER_BYTES, direction="f2a").add_each(moe.f2a_bytes)
        self.child(AFD_EXPOSED).observe_many(moe.afd_exposed_s)
        self.child(AFD_BUBBLE, side="attention").observe_many(moe.attention_bubble_s)
        self.child(AFD_BUBBLE, side="ffn").observe_many(moe.ffn_bubble_s)
        self.child(AFD_FFN_UTILIZATION).observe_many(moe.ffn_utilization)

    def on_state(self, stats: SchedulerStats) -> None:
        """Gauges, and the counters the scheduler, block manager and encoder cache keep as totals (at
        steps and on arrivals)."""
        held, running, waiting, usage = self._state
        held.set(stats.num_kv_held_blocks)
        running.set(stats.num_running_reqs)
        waiting.set(stats.num_waiting_reqs)
        usage.set(stats.kv_cache_usage)
        was = self._counted
        if stats.num_deferred_waiting_reqs != was.num_deferred_waiting_reqs or (
            stats.num_waiting_reqs != was.num_waiting_reqs
        ):
            deferred = stats.num_deferred_waiting_reqs
            self.child(NUM_REQUESTS_WAITING_BY_REASON, reason="capacity").set(
                stats.num_waiting_reqs - deferred
            )
            self.child(NUM_REQUESTS_WAITING_BY_REASON, reason="deferred").set(deferred)
        if stats.num_kv_fetch_reqs_by_stage != was.num_kv_fetch_reqs_by_stage:
            for stage, n in zip(KV_FETCH_STAGES, stats.num_kv_fetch_reqs_by_stage, strict=True):
                self.child(NUM_REQUESTS_KV_FETCH, stage=stage).set(n)
        if stats.num_prefix_cache_queries != was.num_prefix_cache_queries:
            self.child(PREFIX_CACHE_QUERIES).inc(
                stats.num_prefix_cache_queries - was.num_prefix_cache_queries
            )
            hits = stats.num_prefix_cache_hits - was.num_prefix_cache_hits
            self.child(PREFIX_CACHE_HITS).inc(hits)
            self.child(PROMPT_TOKENS_CACHED_BY_SOURCE, source="device").inc(hits)  # its own cache
        if stats.num_preemptions != was.num_preemptions:
            self.child(NUM_PREEMPTIONS).inc(stats.num_preemptions - was.num_preemptions)
        if stats.num_mm_cache_queries != was.num_mm_cache_queries:
            self.child(MM_CACHE_QUERIES).inc(stats.num_mm_cache_queries - was.num_mm_cache_queries)
            self.child(MM_CACHE_HITS).inc(stats.num_mm_cache_hits - was.num_mm_cache_hits)
        self._counted = stats

    def on_first_token(
        self,
        ttft_s: float,
        num_prompt_tokens: int,
        num_cached_tokens: int,
        num_external_tokens: Mapping[str, int],
    ) -> None:
        """A request's first token (engine-level TTFT counts from entering the engine's queue). Its
        prompt's tokens by source, as vLLM counts them once for its first scheduling (local cache
        hits, `num_cached_tokens`; KV from a peer or an offload tier, `num_external_tokens` by
        source)."""
        num_external = sum(num_external_tokens.values())
        self._ttft.observe(ttft_s)
        computed = num_prompt_tokens - num_cached_tokens - num_external
        self.child(PROMPT_TOKENS).inc(num_prompt_tokens)
        self.child(PROMPT_TOKENS_BY_SOURCE, source="local_compute").inc(computed)
        self.child(PROMPT_TOKENS_BY_SOURCE, source="local_cache_hit").inc(num_cached_tokens)
        self.child(PROMPT_TOKENS_BY_SOURCE, source="external_kv_transfer").inc(num_external)
        self.child(PROMPT_TOKENS_CACHED).inc(num_cached_tokens + num_external)
        if self._connector:  # the connector is asked for what the local cache lacked
            self.child(EXTERNAL_PREFIX_CACHE_QUERIES).inc(num_prompt_tokens - num_cached_tokens)
            self.child(EXTERNAL_PREFIX_CACHE_HITS).inc(num_external)
            for source, num in num_external_tokens.items():
                self.child(PROMPT_TOKENS_CACHED_BY_SOURCE, source=source).inc(num)
        self._gen.inc()

    def on_next_tokens(self, itls_s: Sequence[float]) -> None:
        self._itl.observe_many(itls_s)
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
        self.child(REQUEST_PARAMS_N).observe(1)  # one sequence a request (no parallel sampling)
        self.child(REQUEST_NUM_PREEMPTIONS).observe(t.num_preemptions)
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

    def on_kv_transfer_done(
        self, xfer_s: float, post_s: float, kv_bytes: int, num_blocks: int, state_bytes: int = 0
    ) -> None:
        """Decode side, pull mode: the prompt KV arrived (a hybrid target's: and its SSM state, which NIXL
        moves with it). Descriptors: one per block, layer, K and V."""
        self.child(NIXL_XFER_TIME).observe(xfer_s)
        self.child(NIXL_POST_TIME).observe(post_s)
        self.child(NIXL_BYTES).observe(kv_bytes + state_bytes)
        if state_bytes > 0:
            self.child(KV_TRANSFER_STATE_BYTES).observe(state_bytes)
        self.child(NIXL_DESCRIPTORS).observe(num_blocks * self._num_layers * 2)
        self.child(KV_HANDOFF, link=self._link, direction=self._direction).observe(xfer_s)

    def on_kv_offload(self, op: str, tier: str, num_bytes: int, op_s: float) -> None:
        """vLLM's offloading connector's series count every tier's transfers together."""
        load = op == "load"
        self.child(KV_OFFLOAD_LOAD_BYTES if load else KV_OFFLOAD_STORE_BYTES).inc(num_bytes)
        self.child(KV_OFFLOAD_LOAD_TIME if load else KV_OFFLOAD_STORE_TIME).inc(op_s)
        self.child(KV_OFFLOAD_LOAD_SIZE if load else KV_OFFLOAD_STORE_SIZE).observe(num_bytes)

    def on_kv_offload_tier(self, tier: str, usage: float, num_evicted: int, num_skipped: int) -> None:
        self.child(KV_OFFLOAD_TIER_USAGE, tier=tier).set(usage)
        self.child(KV_OFFLOAD_TIER_EVICTED, tier=tier).inc(num_evicted)
        self.child(KV_OFFLOAD_TIER_FULL, tier=tier).inc(num_skipped)

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

    def on_kv_notification_after_expiry(self) -> None:
        """Source side: a peer's completion notice for KV no longer held."""
        self.child(NIXL_AFTER_EXPIRY).inc()

    def on_admission_rejected(self, reason: str) -> None:
        self.child(ADMISSION_REJECTIONS, reason=reason).inc()
