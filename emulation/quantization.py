"""Weight and KV cache formats: the bytes a format stores and the tensor cores its GEMMs run on.

A format's GEMMs run on low-precision tensor cores where the GPU has them (W8A8 FP8, W4A4 NVFP4);
where it has none they run as vLLM runs them there, weight-only: the weights stay at their stored width
in memory (what a memory-bound decode step reads) and are dequantized into BF16 GEMMs (vLLM's Marlin
kernels for FP8 on Ampere and FP4 before Blackwell)::

    format      stored bytes / weight             tensor cores           without them
    bf16        2                                 BF16                   -
    fp8         1 (a scale per tensor/channel)    FP8 (sm >= 89)         BF16, weight-only (A100)
    fp8_block   1 (a scale per 128 x 128: 0.02 %) FP8 (sm >= 89)         BF16, weight-only
    nvfp4       0.5 + an FP8 scale per 16: 0.5625 FP4 (Blackwell)        BF16, weight-only (Marlin)
    mxfp4       0.5 + an 8-bit scale per 32       BF16: vLLM's default   -
                                                  MoE kernels take BF16 activations (W4A16)
    int4_wo     0.5 + a BF16 scale per 32: 0.5625 BF16, weight-only      -
                (compressed-tensors W4A16, as Kimi-K2.5's experts)

Scales under 0.1 % of a weight's bytes (per tensor, per channel, per 128 x 128 block) are left out, as
biases and norms are (emulation.model_profile). A GPU whose `peak_fp8_tflops` is its INT8 peak (the
Ascend 910C: no FP8) runs one-byte weights at it, as W8A8 INT8.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from emulation.gpu_profile import Compute, GpuProfile

if TYPE_CHECKING:  # the profile reads FORMATS: a runtime import would be circular
    from emulation.model_profile import ModelProfile

WeightFormat = Literal["bf16", "fp8", "fp8_block", "nvfp4", "mxfp4", "int4_wo"]
KVCacheDtype = Literal["bf16", "fp8"]
WEIGHT_FORMATS: tuple[str, ...] = get_args(WeightFormat)
KV_CACHE_DTYPES: tuple[str, ...] = get_args(KVCacheDtype)
KV_DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp8": 1}
"""Bytes of one KV cache element by `target.quantization.kv_cache`."""


@dataclass(frozen=True)
class FormatSpec:
    """What one weight format stores and the tensor cores it can use."""

    bytes_per_weight: float
    tensor_cores: Compute
    """The low-precision tensor cores its GEMMs use where the GPU has them (bf16: none needed)."""


FORMATS: dict[str, FormatSpec] = {
    "bf16": FormatSpec(2.0, "bf16"),
    "fp8": FormatSpec(1.0, "fp8"),
    "fp8_block": FormatSpec(1.0, "fp8"),
    "nvfp4": FormatSpec(0.5 + 1 / 16, "fp4"),
    "mxfp4": FormatSpec(0.5 + 1 / 32, "bf16"),
    "int4_wo": FormatSpec(0.5 + 2 / 32, "bf16"),
}


def gemm_compute(weight_format: str, gpu: GpuProfile) -> Compute:
    """The tensor cores GEMMs of `weight_format` weights run on, on `gpu` (BF16 where it has none of
    the format's: weight-only)."""
    cores = FORMATS[weight_format].tensor_cores
    if cores == "fp8" and gpu.peak_fp8_tflops is not None:
        return "fp8"
    if cores == "fp4" and gpu.peak_fp4_tflops is not None:
        return "fp4"
    return "bf16"


def gemm_peak_tflops(weight_format: str, gpu: GpuProfile) -> float:
    """Dense peak, TFLOP/s, of GEMMs of `weight_format` weights on `gpu`."""
    return gpu.peak_tflops_of(gemm_compute(weight_format, gpu))


@functools.cache
def quantized(profile: ModelProfile, weights: str, experts: str, kv_cache: str) -> ModelProfile:
    """`profile` with its layer weights, routed experts and KV cache stored as given; auto keeps the
    checkpoint's (experts auto with weights set: as the weights). One object per variant, so its
    cached derived figures are computed once."""
    if weights == experts == kv_cache == "auto":
        return profile
    expert_format = profile.expert_format if experts == weights == "auto" else experts
    return dataclasses.replace(
        profile,
        weight_format=profile.weight_format if weights == "auto" else weights,
        expert_format=weights if expert_format == "auto" else expert_format,
        kv_dtype_bytes=profile.kv_dtype_bytes if kv_cache == "auto" else KV_DTYPE_BYTES[kv_cache],
    )
