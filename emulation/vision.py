"""The emulated target's vision encoder: its geometry, its image processor, and the roofline time of
encoding images.

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

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from emulation.config import PoolConfig, TestbedConfig
from emulation.profiles import GPUS, GpuProfile, base_profile
from emulation.roofline import StepTime, timed


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
    window_patches: int = 0
    """Patches a windowed block attends over (8 x 8 = 64 for 112-pixel windows)."""
    mlp_matrices: int = 3
    """3: a gated MLP (gate, up, down; Qwen2.5-VL), 2: fc1 and fc2 (Qwen3-VL)."""
    num_deepstack_levels: int = 0
    """Inner blocks whose merged outputs go to the LM beside the last one's (Qwen3-VL: 3)."""
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    """The image processor's area bounds (pixels): an image is resized into them."""
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
    """The processor's normalisation (Qwen2.5-VL: CLIP's; Qwen3-VL: 0.5)."""
    image_std: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
    dtype_bytes: int = 2

    @property
    def num_block_params(self) -> int:
        h = self.hidden_size
        return self.depth * (4 * h * h + self.mlp_matrices * h * self.intermediate_size)

    @property
    def num_merger_params(self) -> int:
        merged = self.hidden_size * self.merge_size**2
        return (1 + self.num_deepstack_levels) * (merged * merged + merged * self.out_hidden_size)

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
        """What crosses the encoder/prefill cut per visual token (7 KiB for a 3,584-wide LM; 20 KiB for
        Qwen3-VL-4B: its 2,560-wide embedding and three DeepStack ones, as vLLM caches them)."""
        return (1 + self.num_deepstack_levels) * self.out_hidden_size * self.dtype_bytes

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
        VisionEncoderProfile(  # its processor: Qwen3VLProcessor's preprocessor_config (32-pixel tokens)
            "qwen3-vl-vit-4b",
            depth=24,
            hidden_size=1024,
            intermediate_size=4096,
            num_heads=16,
            out_hidden_size=2560,
            num_full_attention_layers=24,
            mlp_matrices=2,
            num_deepstack_levels=3,
            patch_size=16,
            min_pixels=65536,
            max_pixels=16777216,
            image_mean=(0.5, 0.5, 0.5),
            image_std=(0.5, 0.5, 0.5),
        ),
    )
}


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
