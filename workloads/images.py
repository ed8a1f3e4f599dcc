"""Synthetic images for generated and sampled workloads: visual tokens, hashes, and patches when computed.

An image of N visual tokens is a grid of h x w tokens with h·w = N (the most nearly square), 2h x 2w
patches of random values (the image processor's output shape for the target's patch size, so the real
vision tower can encode it); with compute skip only its hash and size exist. Its placeholders lead
the prompt, as the chat template puts an image before the text of its message::

    [<vs> pad x N1 <ve>] [<vs> pad x N2 <ve>] [text tokens]

Placeholder IDs are the vocabulary's last three (engines only look at images' positions and hashes).
"""

from __future__ import annotations

import dataclasses
import math

import blake3
import numpy as np

from messages import MultiModalItem
from messages.token_ids import PromptIds


def synthetic_image(rng: np.random.Generator, num_tokens: int, patch_size: int | None) -> MultiModalItem:
    """A new image of `num_tokens` visual tokens, at offset 0, with patches of `patch_size` pixels a
    side (RGB, two frames each, as the vision encoder reads them; None: no patches)."""
    h = max(d for d in range(1, math.isqrt(num_tokens) + 1) if num_tokens % d == 0)
    w = num_tokens // h
    patch_dim = 3 * 2 * (patch_size or 0) ** 2
    patches = rng.standard_normal((4 * num_tokens, patch_dim), dtype=np.float32) if patch_size else None
    digest = blake3.blake3(patches.tobytes() if patches is not None else rng.bytes(16)).hexdigest()
    return MultiModalItem(digest, 0, num_tokens, patches, (1, 2 * h, 2 * w))


def with_images(
    token_ids: PromptIds, images: list[MultiModalItem], vocab_size: int
) -> tuple[list[int], list[MultiModalItem]]:
    """`token_ids` behind each image's placeholders, and the images at their offsets."""
    pad, start, end = vocab_size - 1, vocab_size - 2, vocab_size - 3
    head: list[int] = []
    placed = []
    for image in images:
        placed.append(dataclasses.replace(image, offset=len(head) + 1))
        head += [start, *[pad] * image.num_tokens, end]
    return head + token_ids, placed
