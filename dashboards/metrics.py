"""Every Prometheus series the testbed exports: names, types, labels and buckets, in one table.

vLLM's own series keep vLLM's names, labels and buckets exactly (`../shared/reference/vllm-metrics.md`),
so vLLM's and llm-d's dashboards work unchanged; the testbed's additions live under `testbed:`. Every
value is in emulated seconds. Code records only through the `on_<event>` hooks of `dashboards.recorders`;
dashboards refer to series only through the `MetricSpec` constants below; `dashboards.exposition` serves
and reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

COMMON_LABELS = ("model_name", "engine", "role", "replica")
"""On every series: vLLM's `model_name` and `engine` (those of them vLLM puts on it), and the testbed's
`role` and `replica`."""
TESTBED_LABELS = ("role", "replica")
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
"""vLLM's cache tiers (`CacheHitSource`); the testbed's hits come from `device` (its own prefix cache),
`p2p` (KV pulled from a peer engine), `host` and `disk` (its offload tiers), `external_unspecified` (the
shared KV store: vLLM names no source for a store shared across instances)."""
WAITING_REASONS = ("capacity", "deferred")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
"""vLLM's queue limits; the testbed's own arrival limit counts as `max_waiting` (scheduler.max_waiting)."""
CACHE_CONFIG_LABELS = (
    "block_size", "user_specified_block_size", "kv_cache_layout", "prefix_match_unit", "gpu_memory_utilization",
    "cache_dtype", "is_attention_free", "num_gpu_blocks_override", "sliding_window", "enable_prefix_caching",
    "prefix_caching_hash_algo", "prefix_cache_retention_interval", "kv_cache_dtype_skip_layers",
    "mamba_page_size_padded", "skip_page_size_padded", "mamba_block_size", "mamba_cache_dtype",
    "mamba_ssm_cache_dtype", "mamba_cache_mode", "enable_mamba_shared_prefix_checkpoint", "replayssm_buffer_len",
    "use_replayssm", "use_kda_recoverssm", "num_gpu_blocks", "num_cpu_blocks", "effective_attention_block_size",
    "kv_cache_size_tokens", "kv_cache_max_concurrency", "hash_block_size", "cache_hit_alignment_tokens",
    "kv_sharing_fast_prefill", "swa_bounded_replay", "kv_cache_memory_bytes", "kv_offloading_size",
    "kv_offloading_backend", "_block_size_resolved",
)  # fmt: skip
"""`vllm:cache_config_info`'s labels besides `engine`: vLLM's `CacheConfig` fields (its `metrics_info`)."""

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
REQ_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
NIXL_XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_POST_BUCKETS = (0.001, *NIXL_XFER_BUCKETS)
NIXL_BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 24, 2))
NIXL_DESCRIPTOR_BUCKETS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)
HANDOFF_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 1.5, 2.0, 5.0, 10.0, 30.0)
MOE_TOKENS_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0,
                      1000.0, 2000.0, 5000.0, 10000.0, 20000.0, 50000.0)  # fmt: skip
"""Token-expert assignments per expert in a step, 1-2-5 steps: from a lone decode's share on a wide model
(DeepSeek-V3: 1 x 8 / 256 = 0.03) to a busy expert of 48 DP ranks' full prefill chunks."""
MOE_IMBALANCE_BUCKETS = (1.0, 1.05, 1.1, 1.2, 1.3, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0, 64.0)
"""The busiest EP rank over the mean rank: 1 is balanced (and every step of ep=1); big steps land near 1,
single decodes over many ranks far above (DeepSeek-V3, ep 32, one token: 6.2); at most ep."""
OFFLOAD_SIZE_BUCKETS = (1e6, 5e6, 10e6, 20e6, 40e6, 60e6, 80e6, 100e6, 150e6, 200e6)
"""vLLM's offloading connector's transfer sizes, bytes."""
UTILIZATION_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
"""A share of a step, 0 to 1."""
MOE_ALL_TO_ALL_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                          1.0, 2.5, 5.0)  # fmt: skip
"""A step's dispatches and combines over all MoE layers: about 1 ms (Qwen3-30B-A3B, ep 4, decodes) to
0.2 s (DeepSeek-V3, ep 32, 64k tokens); 0 without data-parallel attention (first bucket)."""
TOKENS_125 = "1-2-5 up to max_model_len"


def buckets_125(max_model_len: int) -> tuple[float, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... while <= max_model_len."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_model_len:
                return tuple(out)
            out.append(float(value))
        exponent += 1


@dataclass(frozen=True)
class MetricSpec:
    """One series as declared; `exposed` is the name Prometheus stores (counters gain `_total`)."""

    name: str
    kind: Literal["counter", "gauge", "histogram"]
    doc: str
    labels: tuple[str, ...] = ()
    """Labels beyond the common ones."""
    buckets: tuple[float, ...] | str | None = None
    common: tuple[str, ...] = COMMON_LABELS
    """The common labels it has: all but a family vLLM exports without `engine` or `model_name`."""

    @property
    def exposed(self) -> str:
        return f"{self.name}_total" if self.kind == "counter" else self.name

    @property
    def bucket(self) -> str:
        return f"{self.name}_bucket"

    @property
    def sum(self) -> str:
        return f"{self.name}_sum"

    @property
    def count(self) -> str:
        return f"{self.name}_count"


def _h(name: str, doc: str, buckets: tuple[float, ...] | str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, "histogram", doc, labels, buckets)


def _c(name: str, doc: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, "counter", doc, labels)


def _g(name: str, doc: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, "gauge", doc, labels)


# ---- vLLM engine series ------------------------------------------------------------------------------
NUM_REQUESTS_RUNNING = _g("vllm:num_requests_running", "Number of requests in model execution batches.")
NUM_REQUESTS_WAITING = _g("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
NUM_REQUESTS_WAITING_BY_REASON = _g("vllm:num_requests_waiting_by_reason", "Number of waiting requests by reason: 'capacity' = waiting for scheduling capacity; 'deferred' = waiting for their KV transfer. Sum of all reasons equals vllm:num_requests_waiting.", ("reason",))  # fmt: skip
NUM_REQUESTS_KV_FETCH = _g("vllm:num_requests_kv_fetch_by_stage", "Number of waiting requests by async KV load stage: 'waiting_to_start' (no blocks yet), 'in_progress' (loading), 'completed_waiting' (loaded, not running yet).", ("stage",))  # fmt: skip
ENGINE_SLEEP_STATE = _g("vllm:engine_sleep_state", "Engine sleep state; awake = 1 means engine is awake (testbed engines never sleep).", ("sleep_state",))  # fmt: skip
CACHE_CONFIG_INFO = MetricSpec("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", CACHE_CONFIG_LABELS, common=("engine", *TESTBED_LABELS))  # fmt: skip
KV_CACHE_USAGE = _g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
PREFIX_CACHE_QUERIES = _c("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")  # fmt: skip
PREFIX_CACHE_HITS = _c("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
EXTERNAL_PREFIX_CACHE_QUERIES = _c("vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.")  # fmt: skip
EXTERNAL_PREFIX_CACHE_HITS = _c("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.")  # fmt: skip
PROMPT_TOKENS_CACHED = _c("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).")
PROMPT_TOKENS_CACHED_BY_SOURCE = _c("vllm:prompt_tokens_cached_by_source", "Prefix-cache hit tokens by the cache tier that supplied them: device (local prefix cache) or p2p (transferred from another instance). Sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.", ("source",))  # fmt: skip
PROMPT_TOKENS = _c("vllm:prompt_tokens", "Number of prefill tokens processed.")
PROMPT_TOKENS_BY_SOURCE = _c(
    "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ("source",)
)
GENERATION_TOKENS = _c("vllm:generation_tokens", "Number of generation tokens processed.")
REQUEST_SUCCESS = _c("vllm:request_success", "Count of successfully processed requests.", ("finished_reason",))  # fmt: skip
NUM_PREEMPTIONS = _c("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
ADMISSION_REJECTIONS = MetricSpec("vllm:admission_rejections", "counter", "Number of admission attempts rejected by a queue limit, by reason.", ("reason",), common=("model_name", *TESTBED_LABELS))  # fmt: skip
ESTIMATED_FLOPS = _c("vllm:estimated_flops_per_gpu", "Estimated number of floating point operations per GPU (the time model's, for Model Flops Utilization calculations).")  # fmt: skip
ESTIMATED_READ_BYTES = _c("vllm:estimated_read_bytes_per_gpu", "Estimated number of bytes read from memory per GPU (the time model's).")  # fmt: skip
ESTIMATED_WRITE_BYTES = _c("vllm:estimated_write_bytes_per_gpu", "Estimated number of bytes written to memory per GPU (the KV of new tokens).")  # fmt: skip
MM_CACHE_QUERIES = _c("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.")  # fmt: skip
MM_CACHE_HITS = _c("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.")
TTFT = _h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS)
ITL = _h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
TPOT = _h("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)  # fmt: skip
E2E = _h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQ_BUCKETS)
QUEUE_TIME = _h("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", REQ_BUCKETS)  # fmt: skip
INFERENCE_TIME = _h("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", REQ_BUCKETS)  # fmt: skip
PREFILL_TIME = _h("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", REQ_BUCKETS)  # fmt: skip
DECODE_TIME = _h("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", REQ_BUCKETS)  # fmt: skip
REQUEST_PROMPT_TOKENS = _h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKENS_125)
REQUEST_GENERATION_TOKENS = _h("vllm:request_generation_tokens", "Number of generation tokens processed.", TOKENS_125)  # fmt: skip
REQUEST_MAX_TOKENS = _h("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", TOKENS_125)  # fmt: skip
REQUEST_MAX_GENERATION_TOKENS = _h("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.", TOKENS_125)  # fmt: skip
REQUEST_PARAMS_N = _h(
    "vllm:request_params_n", "Histogram of the n request parameter.", REQUEST_PARAMS_N_BUCKETS
)
REQUEST_NUM_PREEMPTIONS = _h("vllm:request_num_preemptions", "Histogram of the number of times a request was preempted.", REQUEST_NUM_PREEMPTIONS_BUCKETS)  # fmt: skip
REQUEST_PREFILL_KV_COMPUTED = _h("vllm:request_prefill_kv_computed_tokens", "Histogram of new KV tokens computed during prefill (excluding cached tokens).", TOKENS_125)  # fmt: skip
ITERATION_TOKENS = _h("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_BUCKETS)  # fmt: skip

# ---- KV handoff, NIXL connector names (recorded by the side that starts the transfer) ---------------
NIXL_XFER_TIME = _h("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache transfers.", NIXL_XFER_BUCKETS)  # fmt: skip
NIXL_POST_TIME = _h("vllm:nixl_post_time_seconds", "Histogram of transfer post time for NIXL KV Cache transfers.", NIXL_POST_BUCKETS)  # fmt: skip
NIXL_BYTES = _h("vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV Cache transfers.", NIXL_BYTES_BUCKETS)  # fmt: skip
NIXL_DESCRIPTORS = _h("vllm:nixl_num_descriptors", "Histogram of number of descriptors per NIXL KV Cache transfers.", NIXL_DESCRIPTOR_BUCKETS)  # fmt: skip
NIXL_FAILED_TRANSFERS = _c("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers.")
NIXL_FAILED_NOTIFICATIONS = _c("vllm:nixl_num_failed_notifications", "Number of failed NIXL KV Cache notifications.")  # fmt: skip
NIXL_KV_EXPIRED = _c("vllm:nixl_num_kv_expired_reqs", "Number of requests that had their KV expire.")
NIXL_AFTER_EXPIRY = _c("vllm:nixl_num_notifications_after_expiry", "Number of completion notifications for requests that were no longer tracked, usually because their KV lease expired.")  # fmt: skip

# ---- the testbed's own ---------------------------------------------------------------------------------
TIME_SCALE = _g("testbed:time_scale", "Wall seconds per emulated second (multiply per-wall-second rates by it).")  # fmt: skip
STEPS = _c("testbed:steps", "Engine steps run.")
LAGGED_STEPS = _c("testbed:lagged_steps", "Steps whose real work overran their emulated budget (lag).")
LAGGED_KV_TRANSFERS = _c("testbed:lagged_kv_transfers", "KV pulls whose real move finished after the emulated transfer.")  # fmt: skip
MAX_OVERRUN = _g("testbed:max_overrun_seconds", "Worst overrun of a step or KV pull so far, emulated seconds.")  # fmt: skip
BUSY = _c("testbed:busy_seconds", "Emulated seconds the engine spent in steps (utilisation = its rate).")
STEP_CPU = _c("testbed:step_cpu_seconds", "Of the busy seconds, the CPU work on the steps' path (scheduling, inputs, sampling, outputs: the time model's overhead).")  # fmt: skip
# ---- KV offloading: vLLM's offloading connector's names, the tiers' occupancy per tier ---------------
KV_OFFLOAD_LOAD_BYTES = _c("vllm:kv_offload_load_bytes", "Total bytes loaded from offload storage to GPU.")
KV_OFFLOAD_LOAD_TIME = _c("vllm:kv_offload_load_time", "Total load time from offload storage to GPU, in seconds.")  # fmt: skip
KV_OFFLOAD_LOAD_SIZE = _h("vllm:kv_offload_load_size", "Histogram of KV offload load operation size, in bytes.", OFFLOAD_SIZE_BUCKETS)  # fmt: skip
KV_OFFLOAD_STORE_BYTES = _c("vllm:kv_offload_store_bytes", "Total bytes stored from GPU to offload storage.")
KV_OFFLOAD_STORE_TIME = _c("vllm:kv_offload_store_time", "Total store time from GPU to offload storage, in seconds.")  # fmt: skip
KV_OFFLOAD_STORE_SIZE = _h("vllm:kv_offload_store_size", "Histogram of KV offload store operation size, in bytes.", OFFLOAD_SIZE_BUCKETS)  # fmt: skip
KV_OFFLOAD_TIER_USAGE = _g("testbed:kv_offload_tier_usage_perc", "Fraction of an offload tier's blocks holding KV (0-1).", ("tier",))  # fmt: skip
KV_OFFLOAD_TIER_EVICTED = _c("testbed:kv_offload_evicted_blocks", "Blocks an offload tier evicted, least recently used first, to store others.", ("tier",))  # fmt: skip
KV_OFFLOAD_TIER_FULL = _c("testbed:kv_offload_stores_skipped_full", "Stores an offload tier skipped: every block it could evict was being loaded or stored.", ("tier",))  # fmt: skip
KV_HELD_BLOCKS = _g("testbed:kv_held_blocks", "Prefill side: KV blocks of finished requests held until decode's completion notice.")  # fmt: skip
KV_HANDOFF = _h("testbed:kv_handoff_seconds", "KV handoff time per request (transfer start to done) by link and direction (p2d: prefill to decode; d2p: a conversation's blocks pulled back, bidirectional).", HANDOFF_BUCKETS, ("link", "direction"))  # fmt: skip
KV_CONVERSATION_BLOCKS = _g("testbed:kv_conversation_held_blocks", "Decode side, bidirectional: KV blocks of finished turns kept for their conversation's next turn.")  # fmt: skip
KV_PULL_BACK_FAILED = _c("testbed:kv_pull_back_failed", "Bidirectional: pull backs that found decode's blocks gone (expired, engine lost) and recomputed.")  # fmt: skip
KV_TRANSFER_STATE_BYTES = _h("testbed:kv_transfer_state_bytes", "Decode side, hybrid (attention + SSM) targets: SSM state bytes a handoff moved beside the attention KV, a fixed size a request (vllm:nixl_bytes_transferred observes both together; exported by engines of hybrid targets only).", NIXL_BYTES_BUCKETS)  # fmt: skip
# Client-side (proxy): what the user sees, end to end through every role.
KV_HANDOFF_PARTS = _h("testbed:kv_handoff_part_seconds", "A P/D request's path from prefill's token to decode's first, by part (they add up).", HANDOFF_BUCKETS, ("part",))  # fmt: skip
CLIENT_TTFT = _h("testbed:time_to_first_token_seconds", "Client-visible time to first token (proxy).", TTFT_BUCKETS)  # fmt: skip
CLIENT_E2E = _h("testbed:e2e_request_latency_seconds", "Client-visible end-to-end latency (proxy).", REQ_BUCKETS)  # fmt: skip
MAX_GAP = _h("testbed:max_inter_token_gap_seconds", "Each request's worst gap between two tokens (proxy).", ITL_BUCKETS)  # fmt: skip
WORST_GAP = _g("testbed:worst_inter_token_gap_seconds", "The worst gap between two tokens of any request so far.")  # fmt: skip
REQUESTS_FINISHED = _c("testbed:requests_finished", "Requests the proxy finished, by how they ended.", ("finished_reason",))  # fmt: skip
SLO_MET = _c("testbed:slo_met", "Requests that finished within every bound of an SLO set (goodput = rate).", ("slo",))  # fmt: skip
# Replayed sessions and the router (proxy): what each pool's router chose and the prefix it expected.
ROUTED = _c("testbed:router_decisions", "Requests routed, by pool and the engine chosen.", ("pool", "routed_to"))  # fmt: skip
ROUTED_PROMPT_BLOCKS = _c("testbed:router_prompt_blocks", "Prompt blocks of routed requests, by pool.", ("pool",))  # fmt: skip
ROUTED_OVERLAP_BLOCKS = _c("testbed:router_overlap_blocks", "Leading prompt blocks the chosen engine held when chosen (the router's view), by pool.", ("pool",))  # fmt: skip
SESSIONS_ACTIVE = _g("testbed:sessions_active", "Replayed sessions with a request in flight at the proxy.")  # fmt: skip
SESSION_TTFT = _h("testbed:session_time_to_first_token_seconds", "Client TTFT of replayed session turns, by turn (1: a session's first).", TTFT_BUCKETS, ("turn",))  # fmt: skip
TURN_BUCKETS = ("1", "2", "3-4", "5-8", "9-16", "17+")
"""`turn` label values of SESSION_TTFT: a turn's 1-based index, bucketed."""
# Mixture-of-experts targets (engines), one observation a step: what the time model expects of the step's
# expert routing (`emulation.moe.ExpertLoad`) and expert-parallel communication. vLLM has no such family.
MOE_MAX_TOKENS_PER_EXPERT = _h("testbed:moe_max_tokens_per_expert", "MoE targets: the busiest routed expert's tokens in a step (expected, under the routing skew).", MOE_TOKENS_BUCKETS)  # fmt: skip
MOE_MEAN_TOKENS_PER_EXPERT = _h("testbed:moe_mean_tokens_per_expert", "MoE targets: a step's tokens x top_k / routed experts.", MOE_TOKENS_BUCKETS)  # fmt: skip
MOE_EP_IMBALANCE = _h("testbed:moe_ep_imbalance", "MoE targets: a step's busiest expert-parallel rank's token-expert assignments over the mean rank's (1: balanced).", MOE_IMBALANCE_BUCKETS)  # fmt: skip
MOE_ALL_TO_ALL = _h("testbed:moe_all_to_all_seconds", "MoE targets: a step's all-to-all time (every MoE layer's dispatch and combine; 0 without data-parallel attention).", MOE_ALL_TO_ALL_BUCKETS)  # fmt: skip
MOE_DBO_HIDDEN = _c("testbed:moe_dbo_hidden_seconds", "MoE targets: emulated step seconds dual-batch overlap hid (communication under compute; 0 without enable_dbo).")  # fmt: skip
AFD_TRANSFER_BYTES = _c("testbed:afd_transfer_bytes", "Attention-FFN disaggregation: bytes of hidden states across the cut, all MoE layers (direction a2f: to the FFN ranks; f2a: back).", ("direction",))  # fmt: skip
AFD_EXPOSED = _h("testbed:afd_exposed_communication_seconds", "Attention-FFN disaggregation: what a step's transfers across the cut added to it (the micro-batch pipeline did not hide).", MOE_ALL_TO_ALL_BUCKETS)  # fmt: skip
AFD_BUBBLE = _h("testbed:afd_bubble_seconds", "Attention-FFN disaggregation: a step's idle time inside its micro-batch pipeline, per side (attention: waiting on the experts or the link; ffn: waiting on attention or the link).", MOE_ALL_TO_ALL_BUCKETS, ("side",))  # fmt: skip
AFD_FFN_UTILIZATION = _h("testbed:afd_ffn_utilization", "Attention-FFN disaggregation: the share of a step the FFN rank serving the busiest attention rank computed.", UTILIZATION_BUCKETS)  # fmt: skip
AFD_SERIES = (AFD_TRANSFER_BYTES, AFD_EXPOSED, AFD_BUBBLE, AFD_FFN_UTILIZATION)
MOE_SERIES = (MOE_MAX_TOKENS_PER_EXPERT, MOE_MEAN_TOKENS_PER_EXPERT, MOE_EP_IMBALANCE, MOE_ALL_TO_ALL, MOE_DBO_HIDDEN, *AFD_SERIES)  # fmt: skip
"""An engine of a MoE target exports these beside `ENGINE_SERIES`; one of a dense target, none of them."""

ENGINE_SERIES = (
    NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING, NUM_REQUESTS_WAITING_BY_REASON, NUM_REQUESTS_KV_FETCH,
    ENGINE_SLEEP_STATE, CACHE_CONFIG_INFO, KV_CACHE_USAGE, PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS,
    EXTERNAL_PREFIX_CACHE_QUERIES, EXTERNAL_PREFIX_CACHE_HITS, PROMPT_TOKENS, PROMPT_TOKENS_BY_SOURCE,
    PROMPT_TOKENS_CACHED, PROMPT_TOKENS_CACHED_BY_SOURCE, GENERATION_TOKENS, REQUEST_SUCCESS, NUM_PREEMPTIONS,
    ADMISSION_REJECTIONS, ESTIMATED_FLOPS, ESTIMATED_READ_BYTES, ESTIMATED_WRITE_BYTES,
    MM_CACHE_QUERIES, MM_CACHE_HITS, TTFT, ITL, TPOT, E2E, QUEUE_TIME, INFERENCE_TIME, PREFILL_TIME,
    DECODE_TIME, REQUEST_PROMPT_TOKENS, REQUEST_GENERATION_TOKENS, REQUEST_MAX_TOKENS,
    REQUEST_MAX_GENERATION_TOKENS, REQUEST_PARAMS_N, REQUEST_NUM_PREEMPTIONS, REQUEST_PREFILL_KV_COMPUTED,
    ITERATION_TOKENS, NIXL_XFER_TIME, NIXL_POST_TIME, NIXL_BYTES, NIXL_DESCRIPTORS, NIXL_FAILED_TRANSFERS,
    NIXL_FAILED_NOTIFICATIONS, NIXL_KV_EXPIRED, NIXL_AFTER_EXPIRY, TIME_SCALE, STEPS, LAGGED_STEPS, LAGGED_KV_TRANSFERS, MAX_OVERRUN, BUSY, STEP_CPU, KV_HANDOFF,
    KV_CONVERSATION_BLOCKS, KV_PULL_BACK_FAILED,
    KV_HELD_BLOCKS,
)  # fmt: skip
HYBRID_SERIES = (KV_TRANSFER_STATE_BYTES,)
"""An engine of a hybrid (attention + SSM) target exports these beside `ENGINE_SERIES`."""
OFFLOAD_SERIES = (
    KV_OFFLOAD_LOAD_BYTES, KV_OFFLOAD_LOAD_TIME, KV_OFFLOAD_LOAD_SIZE, KV_OFFLOAD_STORE_BYTES,
    KV_OFFLOAD_STORE_TIME, KV_OFFLOAD_STORE_SIZE, KV_OFFLOAD_TIER_USAGE, KV_OFFLOAD_TIER_EVICTED,
    KV_OFFLOAD_TIER_FULL,
)  # fmt: skip
"""An engine with KV offload tiers (`kv_offload`) exports these beside `ENGINE_SERIES`."""
# Render tier: CPU seconds of real work (CPU ms per 1k tokens = cpu rate / tokens rate), calls per replica.
RENDER_CPU = _c("testbed:render_cpu_seconds", "CPU seconds spent rendering (templates), processing images (decode, resize, hash) or derendering (detokenize + parse).", ("op",))  # fmt: skip
RENDER_TOKENS = _c("testbed:render_tokens", "Tokens rendered (prompt), visual tokens of processed images, or tokens derendered (output).", ("op",))  # fmt: skip
RENDER_CALLS = _c("testbed:render_calls", "Render calls (one per request), images processed, and derender calls (one per chunk).", ("op",))  # fmt: skip

# Encoder role (E/P/D): steps and busy time share the engines' names (role="encoder").
ENCODER_JOBS_WAITING = _g("testbed:encoder_jobs_waiting", "Encoder side: images queued for encoding.")
ENCODER_STEP_TOKENS = _h("testbed:encoder_step_visual_tokens", "Encoder side: visual tokens encoded per step.", TOKENS_125)  # fmt: skip
ENCODE = _h("testbed:encode_seconds", "Proxy side, E/P/D: a request's wait for its images (encoder queue, encoding, EC transfer to prefill).", HANDOFF_BUCKETS)  # fmt: skip
EC_TRANSFER = _h("testbed:ec_transfer_seconds", "Proxy side, E/P/D: of that wait, the last-landing image's embeddings moving encoder -> prefill (ec_transfer.link).", HANDOFF_BUCKETS)  # fmt: skip

PROXY_SERIES = (
    TIME_SCALE,
    ENCODE,
    EC_TRANSFER,
    CLIENT_TTFT,
    CLIENT_E2E,
    MAX_GAP,
    WORST_GAP,
    REQUESTS_FINISHED,
    SLO_MET,
    KV_HANDOFF_PARTS,
    ROUTED,
    ROUTED_PROMPT_BLOCKS,
    ROUTED_OVERLAP_BLOCKS,
    SESSIONS_ACTIVE,
    SESSION_TTFT,
)
RENDER_SERIES = (RENDER_CPU, RENDER_TOKENS, RENDER_CALLS)
ENCODER_SERIES = (
    TIME_SCALE,
    STEPS,
    BUSY,
    ENCODER_JOBS_WAITING,
    ENCODER_STEP_TOKENS,
    MM_CACHE_QUERIES,
    MM_CACHE_HITS,
)
ALL_SERIES = tuple(
    dict.fromkeys(ENGINE_SERIES + MOE_SERIES + HYBRID_SERIES + PROXY_SERIES + RENDER_SERIES + ENCODER_SERIES)
)
