"""Weight and KV cache formats: the bytes a format stores and the tensor cores its GEMMs run on.

A format's GEMMs run on low-precision tensor cores where the GPU has them (W8A8 FP8, W4A4 NVFP4);
where it has none they run as vLLM runs them there, weight-only: the weights stay at their stored width
in memory (what a memory-bound decode step reads) and are dequantized into BF16 GEMMs (vLLM's Marlin
kernels for FP8 on Ampere and FP4 before Blackwell)::

    format      stored bytes / weight             tensor cores (vLLM 0.32's kernels)     without them
    bf16        2                                 BF16                                   -
    fp8         1 (a scale per tensor/channel)    FP8 from sm 89 (CUTLASS, Triton MoE)   BF16, weight-only
    fp8_block   1 (a scale per 128 x 128: 0.02 %) FP8 from sm 90; MoE from sm 89 (on     BF16, weight-only
                                                  sm 89 its linear layers run on Marlin)
    nvfp4       0.5 + an FP8 scale per 16: 0.5625 FP4 from sm 100 (CUTLASS, FlashInfer)  BF16, weight-only
    mxfp4       0.5 + an 8-bit scale per 32       none: vLLM's MoE kernels take BF16     -
                                                  activations by default (W4A16)
    int4_wo     0.5 + a BF16 scale per 32: 0.5625 none (Marlin, Machete: W4A16)          -
                (compressed-tensors W4A16, as Kimi-K2.5's experts)

Scales under 0.1 % of a weight's bytes (per tensor, per channel, per 128 x 128 block) are left out, as
biases and norms are (emulation.model_profile). A GPU whose `peak_fp8_tflops` is its INT8 peak (the
Ascend 910C: no FP8) runs one-byte weights at it, as W8A8 INT8.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, cast

from emulation.gpu_profile import Compute, GpuProfile

if TYPE_CHECKING:  # the profile reads FORMATS: a runtime import would be circular
    from emulation.model_profile import ModelProfile

WeightFormat = Literal["bf16", "fp8", "fp8_block", "nvfp4", "mxfp4", "int4_wo"]
KV_DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp8": 1}
"""Bytes of one KV cache element by `target.quantization.kv_cache`."""


Kernels = Literal["linear", "moe"]
"""vLLM's two kernel families: dense layers' GEMMs and the routed experts' fused MoE."""


@dataclass(frozen=True)
class FormatSpec:
    """What one weight format stores and the tensor cores it can use."""

    bytes_per_weight: float
    tensor_cores: Compute
    """The low-precision tensor cores its GEMMs use where vLLM has kernels for them (bf16: none)."""
    min_sm_linear: int = 0
    """The compute capability (x 10) from which vLLM's linear kernels use them."""
    min_sm_moe: int = 0
    """The same for its fused-MoE kernels."""


FORMATS: dict[str, FormatSpec] = {
    "bf16": FormatSpec(2.0, "bf16"),
    "fp8": FormatSpec(1.0, "fp8", 89, 89),
    "fp8_block": FormatSpec(1.0, "fp8", 90, 89),
    "nvfp4": FormatSpec(0.5 + 1 / 16, "fp4", 100, 100),
    "mxfp4": FormatSpec(0.5 + 1 / 32, "bf16"),
    "int4_wo": FormatSpec(0.5 + 2 / 32, "bf16"),
}


def gemm_compute(weight_format: str, gpu: GpuProfile, kernels: Kernels) -> Compute:
    """The tensor cores `kernels` GEMMs of `weight_format` weights run on, on `gpu`: the format's where
    the GPU has them and vLLM's kernels use them there, else BF16 (weight-only). A GPU that is not
    NVIDIA's (no sm_version) runs them wherever it has the peak (the Ascend 910C: INT8 W8A8)."""
    spec = FORMATS[weight_format]
    peak = gpu.tensor_core_peak(spec.tensor_cores)
    min_sm = spec.min_sm_linear if kernels == "linear" else spec.min_sm_moe
    if peak is None or (gpu.sm_version is not None and gpu.sm_version < min_sm):
        return "bf16"
    return spec.tensor_cores


@dataclass(frozen=True)
class GemmPeaks:
    """The dense peaks, TFLOP/s, a model's weight GEMMs run at on one GPU (a time model reads them at
    every step: it keeps one, `gemm_peaks`)."""

    layers: float
    """The decoder layers' (vLLM's linear kernels, at the layer weights' format)."""
    experts: float
    """The routed experts' (its fused-MoE kernels, at the experts' format)."""


def gemm_peaks(model: ModelProfile, gpu: GpuProfile) -> GemmPeaks:
    """`model`'s GEMM peaks on `gpu` (`gemm_compute`)."""
    return GemmPeaks(
        gpu.peak_tflops_of(gemm_compute(model.weight_format, gpu, "linear")),
        gpu.peak_tflops_of(gemm_compute(model.expert_format, gpu, "moe")),
    )


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
        weight_format=profile.weight_format if weights == "auto" else cast(WeightFormat, weights),
        expert_format=cast(WeightFormat, weights if expert_format == "auto" else expert_format),
        kv_dtype_bytes=profile.kv_dtype_bytes if kv_cache == "auto" else KV_DTYPE_BYTES[kv_cache],
    )
