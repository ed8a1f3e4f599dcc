"""The rules of the target on its GPUs: names that resolve, formats vLLM can run there, and measured
kernel tables where the time model reads them."""

from __future__ import annotations

from collections.abc import Iterator

from cluster.config_rules_hybrid import engine_pools
from cluster.time_model_default import first_without_tables
from emulation.config import TestbedConfig
from emulation.profiles import GPUS
from emulation.silicon_systems import SYSTEM_NAMES, missing_package_line, system_gpus

MIN_SM_MLA_FP8_KV = 89
"""vLLM 0.32 reads an MLA model's FP8 KV cache with Triton MLA from sm 89 (its fallback backend),
FlashMLA on Hopper and FlashInfer or CUTLASS MLA on Blackwell; on sm 80 none takes it and it refuses."""


def unknown_gpu(field: str, name: str) -> str:
    """The line for a GPU name that is not one: the names, and what is missing when aiconfigurator-core
    (which describes most of them) is not installed."""
    line = f"{field}={name!r}: unknown GPU; allowed: {', '.join(GPUS)}"
    if not system_gpus():
        line += f"; {len(SYSTEM_NAMES)} more ({', '.join(SYSTEM_NAMES)}) need {missing_package_line()}"
    return line


def target(cfg: TestbedConfig) -> Iterator[str]:
    yield from _mla_kv_format(cfg)
    yield from _kernel_tables(cfg)


def _kernel_tables(cfg: TestbedConfig) -> Iterator[str]:
    """`time_model: measured` on a pool whose GPU has no such tables, unless `measured_fallback` lets it
    run on the roofline (AFD pools: their pipeline's rooflines, tables or not)."""
    t = cfg.target
    if t.time_model != "measured" or t.measured_fallback == "roofline":
        return
    pools = [(n, p) for n, p in engine_pools(cfg) if p.afd is None and p.gpu in GPUS]  # unknown: a later rule
    if (missing := first_without_tables(t.kernel_tables, pools)) is not None:
        name, pool, e = missing
        yield (
            f"target.time_model='measured': pools.{name}.gpu={pool.gpu!r} has {e}; allowed: a GPU "
            "aiconfigurator-core measured (h100-sxm, h200, b200, l40s, ...), another "
            "target.kernel_tables, or target.measured_fallback: roofline"
        )


def _mla_kv_format(cfg: TestbedConfig) -> Iterator[str]:
    """A KV cache format no attention backend of vLLM's reads on a pool's GPU (before the pools' KV
    room is checked: the format sizes it)."""
    model, q = cfg.target.profile, cfg.target.quantization
    if model.mla is None or model.kv_dtype_bytes != 1:
        return
    for name, pool in engine_pools(cfg):
        sm = GPUS[pool.gpu].sm_version if pool.gpu in GPUS else None  # (an unknown one: a later rule)
        if sm is not None and sm < MIN_SM_MLA_FP8_KV:
            given = "" if q.kv_cache == "fp8" else " (auto: the checkpoint's fp8)"
            yield (
                f"target.quantization.kv_cache={q.kv_cache!r}{given}: vLLM has no MLA attention backend that "
                f"reads an FP8 KV cache on pools.{name}.gpu={pool.gpu!r} (sm {sm}; Triton MLA needs sm "
                f"{MIN_SM_MLA_FP8_KV}); allowed: bf16, or a GPU of sm {MIN_SM_MLA_FP8_KV} or later"
            )
            return
