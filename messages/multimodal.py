"""Images crossing role boundaries: an image of a prompt, an encode job, its embeddings."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class MultiModalItem:
    """render -> proxy -> engines: one image of a prompt, where its visual tokens sit."""

    mm_hash: str
    """BLAKE3 of the processed image (hex): the encoder cache's key, and an extra key of the block
    hashes of every block it overlaps (the same image dedupes KV; two images never share blocks)."""
    offset: int
    """Its first placeholder token's position in the prompt (where its embeddings go)."""
    num_tokens: int
    """Its visual tokens: placeholders in the prompt, embeddings out of the encoder."""
    pixel_values: np.ndarray | None = None
    """[num_patches, 1176] float32, the processed image: what the vision encoder computes on (None
    where only the hash is needed)."""
    grid_thw: tuple[int, int, int] = (1, 0, 0)
    """Its patches along time, height and width (the vision encoder's positions)."""
    encoded: bool = False
    """An encoder pool encoded it: its embeddings come with it (`embeds`; None with compute skip)."""
    embeds: np.ndarray | None = None
    """[num_tokens, runner hidden size] float32, from the encoder pool: what crosses the E/P cut."""


@dataclass
class EncodeJob:
    """proxy -> encoder: one image of a request to encode."""

    request_id: str
    """The request it is for (logs, failures)."""
    item: MultiModalItem
    """The image: its patches are encoded, its hash keys the encoder's cache."""
    arrival_s: float
    """Emulated time the job reaches the encoder (it is not encoded earlier)."""


@dataclass
class EncodedImage:
    """encoder -> proxy: an image's embeddings, and when the encoder had them."""

    mm_hash: str
    embeds: np.ndarray | None
    """[visual tokens, runner hidden size]; None with compute skip. Sent on to prefill: the point."""
    done_s: float
    """Emulated time they were ready on the encoder (their EC transfer starts then)."""
    cached: bool
    """Found in the encoder's cache: no encoder time was spent on it."""
