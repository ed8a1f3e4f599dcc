"""Images in chat requests, processed as the target's image processor does, on the render tier.

An `image_url` content part carries a data URL (base64 JPEG or PNG); nothing is fetched, so a remote
URL is refused. The image is decoded and checked with Pillow, then processed by transformers' own
Qwen2-VL image processor (the PIL one) with the target's settings (`emulation.vision`): resized so that
each side is a multiple of 2p (p-pixel patches, 2x2 merged into one visual token) with the area
within [min_pixels, max_pixels], the aspect ratio kept as closely as that allows, normalised and cut
into patches (`pixel_values`, what the vision encoder reads)::

    Qwen2.5-VL (p = 14)  448 x 448  ->  448 x 448   32 x 32 patches, 16 x 16 = 256 visual tokens
                         1024 x 1024 -> 1036² would be 1,369 tokens; over 1,280 x 28² -> 980² = 1,225
    Qwen3-VL (p = 16)    448 x 448  ->  448 x 448   28 x 28 patches, 14 x 14 = 196 visual tokens

In the prompt an image is `<|vision_start|>` + one `<|image_pad|>` per visual token + `<|vision_end|>`
(the template writes one pad; `expand_image_pads` widens it). Its identity, `mm_hash`, is BLAKE3 over
the processed patches and their grid (vLLM hashes the item with BLAKE3 too), so the same picture sent
twice is one encoder job and shares KV blocks, and two pictures never do.
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
from dataclasses import dataclass
from typing import Any

import blake3
import numpy as np
from PIL import Image, UnidentifiedImageError

from emulation.vision_encoders import VisionEncoderProfile

MAX_ASPECT_RATIO = 200
MAX_DECODED_PIXELS = 8192 * 8192
"""Larger images are refused before they are decoded (Pillow reads the size from the header)."""
IMAGE_PAD = "<|image_pad|>"


class ImageError(ValueError):
    """An image part that cannot be used; `where` names the part (e.g. `messages[1].content[0]`)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # rebuilt where a render actor's error lands
        return ImageError, (self.where, self.message)


@dataclass(frozen=True)
class ProcessedImage:
    mm_hash: str
    """BLAKE3 of the patches and their grid (hex): the encoder cache's key."""
    pixel_values: np.ndarray
    """[num_patches, 3 x 2 x p x p] float32: the image cut into patches, as the vision encoder reads
    them (two temporal frames per patch, an image repeated)."""
    grid_thw: tuple[int, int, int]
    """Patches along time, height and width."""
    num_tokens: int
    """Visual tokens: one per merge_size x merge_size patches."""


def decode_data_url(url: str, where: str) -> Image.Image:
    """The image a `data:image/...;base64,` URL holds; ImageError for anything else."""
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0] if ":" in url else url[:20]
        raise ImageError(where, f"only data URLs (data:image/png;base64,...) are accepted, not {scheme!r}: "
                         "this server fetches nothing")  # fmt: skip
    header, _, payload = url.partition(",")
    if not header.endswith(";base64") or not header[5:].startswith("image/"):
        raise ImageError(where, f"expected data:image/<format>;base64,<data>, got {header[:60]!r}")
    try:
        data = base64.b64decode(payload, validate=True)
        image = Image.open(io.BytesIO(data))
    except (binascii.Error, ValueError):
        raise ImageError(where, "the data URL's payload is not valid base64") from None
    except UnidentifiedImageError:
        raise ImageError(where, "not a decodable image (JPEG or PNG expected)") from None
    if image.format not in ("JPEG", "PNG"):
        raise ImageError(where, f"{image.format} images are not accepted: JPEG or PNG expected")
    width, height = image.size
    if width * height > MAX_DECODED_PIXELS:
        raise ImageError(where, f"{width}x{height} is too large: at most {MAX_DECODED_PIXELS:,} pixels")
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise ImageError(where, f"{width}x{height}: aspect ratio over {MAX_ASPECT_RATIO}")
    try:
        image.load()
    except OSError as e:
        raise ImageError(where, f"not a decodable image ({e})") from None
    return image


@functools.cache
def _processor(vit: VisionEncoderProfile) -> Any:
    """transformers' Qwen2-VL image processor (PIL backend: no torchvision) set as `vit`'s ships."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        size={"shortest_edge": vit.min_pixels, "longest_edge": vit.max_pixels},
        patch_size=vit.patch_size,
        temporal_patch_size=vit.temporal_patch_size,
        merge_size=vit.merge_size,
        image_mean=list(vit.image_mean),
        image_std=list(vit.image_std),
    )


def process_image(url: str, where: str, vit: VisionEncoderProfile) -> ProcessedImage:
    """Decode the image at data URL `url`, then resize, normalise and patch it for vision encoder `vit`."""
    image = decode_data_url(url, where).convert("RGB")
    out = _processor(vit)(images=[image], return_tensors="np")
    pixel_values = np.ascontiguousarray(out["pixel_values"], dtype=np.float32)
    t, h, w = (int(x) for x in out["image_grid_thw"][0])
    digest = blake3.blake3(np.array([t, h, w], dtype=np.int64).tobytes() + pixel_values.tobytes()).hexdigest()
    return ProcessedImage(digest, pixel_values, (t, h, w), t * h * w // vit.merge_size**2)


def expand_image_pads(
    token_ids: list[int], pad_id: int, images: list[ProcessedImage]
) -> tuple[list[int], list[int]]:
    """`token_ids` with its k-th `pad_id` widened to `images[k].num_tokens` pads; and each image's first
    pad position (its offset in the prompt). ImageError if the counts differ."""
    out: list[int] = []
    offsets: list[int] = []
    for t in token_ids:
        if t != pad_id:
            out.append(t)
            continue
        if len(offsets) == len(images):
            raise ImageError("messages", "the prompt holds more image placeholders than images")
        offsets.append(len(out))
        out += [pad_id] * images[len(offsets) - 1].num_tokens
    if len(offsets) != len(images):
        raise ImageError("messages", f"{len(images)} images but {len(offsets)} placeholders in the prompt")
    return out, offsets
