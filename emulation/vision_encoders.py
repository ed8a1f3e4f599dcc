"""Vision encoders as data: a Qwen-VL-style ViT's geometry and its image processor's settings, and the
encoders the testbed knows (emulation.vision says how they are timed; a model from its config gets one
whose vision_config matches, emulation.hf_config)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


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
