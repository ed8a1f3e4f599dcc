"""The emulated target's vision encoder and the roofline time of encoding images (its geometry and
image processor as data: emulation.vision_encoders).

A Qwen-VL-style ViT cuts an image into p-pixel patches (two frames each, an image repeated), runs
`depth` transformer blocks over them (Qwen2.5-VL: window attention over 8 x 8 patches, full attention
in a few blocks; Qwen3-VL: full attention in all), then merges m x m patches into one visual token of
the language model's width (Qwen3-VL also merges three inner blocks' outputs, DeepStack, which the LM
adds into its first layers: every visual token carries 1 + 3 embeddings)::

    params  = depth · (4·h² + k·h·i)  +  mergers (1 + d)·((h·m²)² + h·m²·out)  +  patch embed 3·2·p²·h
              (k = 3 for a gated MLP, 2 for fc1/fc2; d DeepStack levels)
    flops   = 2·P_blocks·N + 2·P_patch·N + 2·P_mergers·N/m²
              + 4·h·N·(num_full·N + num_window·w)          (QKᵀ and PV, N patches of one image)
    t       = max(flops / (peak·η_c), weight bytes / (bw·η_b)) + overhead

Compute-bound for any real image: intensity ≈ N FLOP per weight byte (reference: 448² ≈ 1.35 TFLOP for
Qwen2.5-VL's ViT). Parameter counts agree with transformers' own vision models built from the same
configs (tests/test_roofline.py). Geometry: the Qwen2.5-VL vision_config (depth 32, width 1280, MLP
3420, 16 heads, window 112 px, full attention in blocks 7, 15, 23, 31) and Qwen3-VL-4B-Instruct's
(depth 24, width 1024, MLP 4096, 16 heads, 16-pixel patches, DeepStack from blocks 5, 11, 17).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from emulation.config import PoolConfig, TestbedConfig
from emulation.profiles import GPUS, GpuProfile, base_profile
from emulation.roofline import StepTime, timed
from emulation.vision_encoders import VISION_ENCODERS, VisionEncoderProfile


@dataclass(frozen=True)
class EncoderRoofline:
    """The time model of one encoder replica (or of the encoder run inside an LM engine's step)."""

    encoder: VisionEncoderProfile
    gpu: GpuProfile
    tp: int = 1
    eta_compute: float = 1.0
    eta_bandwidth: float = 1.0
    overhead_s: float = 0.0

    def visual_tokens_time(self, num_tokens: Iterable[int]) -> StepTime:
        """`encode_time` of images of `num_tokens` visual tokens each (merge_size² patches a token)."""
        return self.encode_time(n * self.encoder.merge_size**2 for n in num_tokens)

    def encode_time(self, num_patches: Iterable[int]) -> StepTime:
        """One encoder step over images of `num_patches` each (empty: no time at all)."""
        sizes = list(num_patches)
        if not sizes:
            return StepTime(0.0, 0.0, 0.0, 0.0, 0.0)
        flops = sum(self.encoder.flops(n) for n in sizes)
        nbytes = float(self.encoder.weight_bytes)
        return timed(flops, nbytes, self.gpu, self.tp, self.eta_compute, self.eta_bandwidth, self.overhead_s)


def vision_encoder_of(model: str) -> VisionEncoderProfile | None:
    """The vision encoder of target model `model` (None: a text-only model)."""
    name = base_profile(model).vision_encoder
    return None if name is None else VISION_ENCODERS[name]


def encoder_roofline_for(cfg: TestbedConfig, pool: PoolConfig) -> EncoderRoofline | None:
    """The vision encoder's time on one replica of `pool` (the LM's fitted efficiencies; no step
    overhead of its own: it runs inside a step), or None for a text-only target."""
    vit = vision_encoder_of(cfg.target.model)
    if vit is None:
        return None
    t = cfg.target
    return EncoderRoofline(vit, GPUS[pool.gpu], pool.tp, t.eta_compute, t.eta_bandwidth)
