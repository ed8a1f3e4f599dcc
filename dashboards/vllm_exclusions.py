"""What of vLLM's Prometheus surface the testbed leaves out, each with why (the one list).

`tests/test_vllm_metric_families.py` runs vLLM's engine (the peer, `tests/vllm_peer_scripts/`) and a
testbed P/D and collocated deployment after the same traffic, and requires every family vLLM exports to
be exported by every testbed engine with vLLM's type, label names (plus the testbed's `role` and
`replica`) and buckets, unless it is named here. A name here must still be one vLLM exports, and one the
testbed does not: the list cannot go stale either way.

Families vLLM exports only with a feature the testbed does not emulate switched on (speculative
decoding, LoRA, `--kv-cache-metrics`, NaN checks, watermarking) do not appear after plain traffic and
are not listed. With an offloading connector vLLM also exports its lookup delays
(`vllm:kv_offload_lookup_{sync,async}_delay_seconds`: a lookup here takes no emulated time), its CPU
tier's pinned share (`vllm:kv_offload_cpu_cache_*usage_perc`; the testbed gauges each tier's occupancy
instead) and its config info; the testbed's offload tiers export vLLM's transfer families only. The
HTTP server's families (`http_requests_total`, ...) come from the API front end, not from the engine.
"""

from __future__ import annotations

_PROCESS = (
    "the Python process's own series (prometheus_client's default collectors, which vLLM serves from its "
    "default registry), not the engine's: a testbed actor's registry holds its role's series only, and in "
    "virtual mode every role shares one process"
)

EXCLUDED: dict[str, str] = {
    "python_gc_objects_collected": _PROCESS,
    "python_gc_objects_uncollectable": _PROCESS,
    "python_gc_collections": _PROCESS,
    "python_info": _PROCESS,
    "process_virtual_memory_bytes": _PROCESS,
    "process_resident_memory_bytes": _PROCESS,
    "process_start_time_seconds": _PROCESS,
    "process_cpu_seconds": _PROCESS,
    "process_open_fds": _PROCESS,
    "process_max_fds": _PROCESS,
}
"""vLLM's families the testbed does not export -> why."""

CACHE_CONFIG_DIFFERENCES: dict[str, str] = {
    "kv_cache_layout": "set by vLLM's CPU attention backend (LBHNC); a GPU backend's layout is not emulated",
    "mamba_ssm_cache_dtype": "on a host with AVX-512 BF16, vLLM's CPU platform resets it to float32 for its "
    "accelerated GDN backend (vllm/platforms/cpu.py); elsewhere, and on the emulated GPU, it stays auto",
    "kv_cache_memory_bytes": "the CPU backend's KV space (VLLM_CPU_KVCACHE_SPACE); on a GPU it is unset",
    "prefix_caching_hash_algo": "the testbed chains XXH3-128 block hashes (xxhash), not sha256",
}
"""`vllm:cache_config_info` labels whose value may differ between the CPU peer and the testbed under the same
config -> why (every other label's value must be the same; HOST_DEPENDENT ones differ on some hosts)."""
HOST_DEPENDENT = {"mamba_ssm_cache_dtype"}
