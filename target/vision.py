"""The emulated target's vision encoder: its geometry, and the roofline time of encoding images.

A Qwen2.5-VL-style ViT cuts an image into 14-pixel patches (two frames each, an image repeated), runs
`depth` transformer blocks over them (window attention over 8 x 8 patches, full attention in a few
blocks), then merges 2 x 2 patches into one visual token of the language model's width::

    params  = depth · (4·h² + 3·h·i)  +  merger (h·m²)² + h·m²·out  +  patch embed 3·2·14²·h
    flops   = 2·P_blocks·N + 2·P_patch·N + 2·P_merger·N/m²
              + 4·h·N·(num_full·N + num_window·w)          (QKᵀ and PV, N patches of one image)
    t       = max(flops / (peak·η_c), weight bytes / (bw·η_b)) + overhead

Compute-bound for any real image: intensity ≈ N FLOP per weight byte (reference: 448² ≈ 1.35 TFLOP).
Geometry from the Qwen2.5-VL vision_config (depth 32, width 1280, MLP 3420, 16 heads, window 112 px,
full attention in blocks 7, 15, 23, 31).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from target.config import PoolConfig, TestbedConfig
from target.profiles import GPUS, MODELS, GpuProfile
from target.roofline import StepTime, timed


@dataclass(frozen=True)
class VisionEncoderProfile:
    name: str
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    """The language model's width: one embedding per visual token."""
    num_full_attention_layers: int
    window_patches: int
    """Patches a windowed block attends over (8 x 8 = 64 for 112-pixel windows)."""
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    dtype_bytes: int = 2

    @property
    def num_block_params(self) -> int:
        h = self.hidden_size
        return self.depth * (4 * h * h + 3 * h * self.intermediate_size)

    @property
    def num_merger_params(self) -> int:
        merged = self.hidden_size * self.merge_size**2
        return merged * merged + merged * self.out_hidden_size

    @property
    def num_patch_embed_params(self) -> int:
        return 3 * self.temporal_patch_size * self.patch_size**2 * self.hidden_size

    @property
    def weight_bytes(self) -> int:
        return (
            self.num_block_params + self.num_merger_params + self.num_patch_embed_params
        ) * self.dtype_bytes

    @property
    def embedding_bytes_per_token(self) -> int:
        """What crosses the encoder/prefill cut per visual token (7 KiB for a 3,584-wide LM)."""
        return self.out_hidden_size * self.dtype_bytes

    def flops(self, num_patches: int) -> float:
        """FLOPs of encoding one image of `num_patches` patches (see the module's docstring)."""
        n, h = num_patches, self.hidden_size
        window_layers = self.depth - self.num_full_attention_layers
        attention = (
            4.0 * h * n * (self.num_full_attention_layers * n + window_layers * min(n, self.window_patches))
        )
        return (
            2.0 * (self.num_block_params + self.num_patch_embed_params) * n
            + 2.0 * self.num_merger_params * n / self.merge_size**2
            + attention
        )


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


_QWEN25_VL_VIT = VisionEncoderProfile(
    "qwen2.5-vl-vit-7b",
    depth=32,
    hidden_size=1280,
    intermediate_size=3420,
    num_heads=16,
    out_hidden_size=3584,
    num_full_attention_layers=4,
    window_patches=64,
)
VISION_ENCODERS: dict[str, VisionEncoderProfile] = {
    v.name: v
    for v in (
        _QWEN25_VL_VIT,  # the same ViT in every Qwen2.5-VL size; its merger ends at the LM's width
        dataclasses.replace(_QWEN25_VL_VIT, name="qwen2.5-vl-vit-3b", out_hidden_size=2048),
    )
}


def encoder_roofline_for(cfg: TestbedConfig, pool: PoolConfig) -> EncoderRoofline | None:
    """The vision encoder's time on one replica of `pool` (the LM's fitted efficiencies; no step
    overhead of its own: it runs inside a step), or None for a text-only target."""
    name = MODELS[cfg.target.model].vision_encoder
    if name is None:
        return None
    t = cfg.target
    return EncoderRoofline(VISION_ENCODERS[name], GPUS[pool.gpu], pool.tp, t.eta_compute, t.eta_bandwidth)
