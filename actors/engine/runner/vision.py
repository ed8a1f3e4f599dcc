"""The vision encoder the testbed computes with: a tiny Qwen2.5-VL vision tower with seeded weights.

transformers' own `Qwen2_5_VisionTransformerPretrainedModel` (window attention, a full-attention block,
2 x 2 patch merger) at a tiny size, reading patches of the target's size (14 pixels for Qwen2.5-VL,
16 for Qwen3-VL: what the render tier cuts), its merger's output as wide as the runner model's hidden
size, so its embeddings can stand in for the placeholder tokens' embeddings. Built once, written with
`save_pretrained` and loaded back with `from_pretrained(local_files_only=True)`, as the runner model is.
Its time is the emulated target's (`emulation.vision`), never its own.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

from actors.engine.runner.tiny_model import cache_dir
from emulation.config import RunnerConfig
from messages import MultiModalItem

_LOADED: dict[str, Qwen2_5_VisionTransformerPretrainedModel] = {}


def tiny_vision_config(cfg: RunnerConfig, patch_size: int) -> Qwen2_5_VLVisionConfig:
    """Two blocks 64 wide (the second with full attention), patches of `patch_size` pixels (the
    target's, so it reads what the render tier cuts) merged 2 x 2."""
    return Qwen2_5_VLVisionConfig(
        depth=2,
        hidden_size=64,
        intermediate_size=128,
        num_heads=4,
        out_hidden_size=cfg.hidden_size,
        fullatt_block_indexes=[1],
        patch_size=patch_size,
    )


def vision_model_dir(cfg: RunnerConfig, patch_size: int) -> Path:
    key = json.dumps([cfg.hidden_size, cfg.weights_seed, patch_size, "qwen2.5-vl-vision"])
    return cache_dir() / f"tiny-vision-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def load_vision_model(cfg: RunnerConfig, patch_size: int) -> Qwen2_5_VisionTransformerPretrainedModel:
    """The vision tower (CPU, float32), built and saved on first use, loaded once per process."""
    path = vision_model_dir(cfg, patch_size)
    if not (path / "config.json").exists():
        torch.manual_seed(cfg.weights_seed + 1)
        model = Qwen2_5_VisionTransformerPretrainedModel._from_config(tiny_vision_config(cfg, patch_size))
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        model.save_pretrained(tmp)
        os.replace(tmp, path) if not path.exists() else None
    key = str(path)
    if key not in _LOADED:
        model = Qwen2_5_VisionTransformerPretrainedModel.from_pretrained(
            key, local_files_only=True, dtype=torch.float32
        )
        _LOADED[key] = model.requires_grad_(False).eval()
    return _LOADED[key]


@torch.inference_mode()
def encode_image(
    model: Qwen2_5_VisionTransformerPretrainedModel, pixel_values: np.ndarray, grid_thw: tuple[int, int, int]
) -> np.ndarray:
    """One image's embeddings: [visual tokens, runner hidden size] float32."""
    out = model(torch.from_numpy(pixel_values), grid_thw=torch.tensor([grid_thw]))
    return out.pooler_output.numpy()


def encode_images(
    model: Qwen2_5_VisionTransformerPretrainedModel, items: list[MultiModalItem]
) -> list[np.ndarray]:
    """Each image's embeddings; ValueError for an image that came without its patches."""
    out = []
    for item in items:
        if item.pixel_values is None:
            raise ValueError(f"image {item.mm_hash[:12]} reached a vision encoder without its patches")
        out.append(encode_image(model, item.pixel_values, item.grid_thw))
    return out
