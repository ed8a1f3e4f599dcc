"""The label values of an engine's `vllm:cache_config_info`: vLLM's `CacheConfig` as the testbed's config
and the emulated target have it.

Fields the testbed has take its values (block size, KV blocks, prefix caching, memory share, the KV
capacity and the concurrency it allows, a host offload tier's size); fields of features it does not
emulate (Mamba state, sliding windows, FP8 KV) take the value vLLM gives a full-attention model with
those features off, so that a board grouping by them sees one value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dashboards.metrics import CACHE_CONFIG_LABELS
from emulation.kv_cache import cdiv, num_gpu_blocks

if TYPE_CHECKING:
    from emulation.config import TestbedConfig

FEATURES_OFF = {
    "kv_cache_layout": "None",
    "prefix_match_unit": "None",
    "cache_dtype": "auto",
    "is_attention_free": "False",
    "sliding_window": "None",
    "prefix_cache_retention_interval": "0",
    "kv_cache_dtype_skip_layers": "[]",
    "mamba_page_size_padded": "None",
    "skip_page_size_padded": "None",
    "mamba_block_size": "None",
    "mamba_cache_dtype": "auto",
    "mamba_ssm_cache_dtype": "auto",
    "mamba_cache_mode": "none",
    "enable_mamba_shared_prefix_checkpoint": "False",
    "replayssm_buffer_len": "16",
    "use_replayssm": "False",
    "use_kda_recoverssm": "False",
    "num_cpu_blocks": "None",
    "kv_sharing_fast_prefill": "False",
    "swa_bounded_replay": "True",
    "kv_cache_memory_bytes": "None",
    "kv_offloading_size": "None",
    "kv_offloading_backend": "native",
    "_block_size_resolved": "True",
}
"""vLLM 0.32's values of the fields whose feature the testbed has no counterpart of."""


def cache_config_info(cfg: TestbedConfig, role: str) -> dict[str, str]:
    """Every `CACHE_CONFIG_LABELS` value of an engine of `role` (its pool's KV blocks)."""
    s = cfg.scheduler
    pool = getattr(cfg.pools, role)
    blocks = num_gpu_blocks(cfg, pool)
    concurrency = blocks / cdiv(s.max_model_len, s.block_size)  # requests of max_model_len that fit
    own = {
        "block_size": str(s.block_size),
        "user_specified_block_size": "True",  # scheduler.block_size always says it
        "gpu_memory_utilization": str(cfg.target.gpu_memory_utilization),
        "num_gpu_blocks_override": str(s.num_gpu_blocks_override),
        "enable_prefix_caching": str(s.enable_prefix_caching),
        "prefix_caching_hash_algo": "xxhash",  # chained XXH3-128 (actors.engine.kv_cache.block_hash)
        "num_gpu_blocks": str(blocks),
        "effective_attention_block_size": str(s.block_size),
        "kv_cache_size_tokens": str(int(concurrency * s.max_model_len)),
        "kv_cache_max_concurrency": str(concurrency),
        "hash_block_size": str(s.block_size),
        "cache_hit_alignment_tokens": str(s.block_size),
    }
    if cfg.kv_offload.host_gb:  # vLLM's --kv-offloading-size, in GiB
        own["kv_offloading_size"] = str(cfg.kv_offload.host_gb * 1e9 / 2**30)
    values = {**FEATURES_OFF, **own}
    assert values.keys() == set(CACHE_CONFIG_LABELS), values.keys() ^ set(CACHE_CONFIG_LABELS)
    return {name: values[name] for name in CACHE_CONFIG_LABELS}
