"""Chained block hashes, stable across processes and nodes (as vLLM's `xxhash` prefix-caching hash).

A block's hash covers its own tokens *and* every token before it::

    h0 = H(ROOT || tokens[0:16])   h1 = H(h0 || tokens[16:32])   h2 = H(h1 || tokens[32:48])

so a changed history changes every later hash. H is XXH3-128 over the parent's digest and the block's
token IDs as little-endian uint32: the same bytes, so the same hash, on every machine, and a router
(or another engine) can compare hashes computed in other actors. Python's `hash` is salted per
process. XXH3 rather than SHA-256: as stable, and 3x faster where every prompt block is hashed
(an 8k-token prompt: 0.13 ms against 0.4 ms); 128 bits keep collisions out of reach.
"""

from __future__ import annotations

from collections.abc import Sequence

import xxhash

from messages import MultiModalItem
from messages.token_ids import bytes_of

BlockHash = bytes

ROOT_BLOCK_HASH: BlockHash = xxhash.xxh3_128_digest(b"disagg-testbed prefix cache")
"""The parent of a sequence's first block."""


def hash_blocks(
    token_ids: Sequence[int],
    block_size: int,
    parent: BlockHash = ROOT_BLOCK_HASH,
    mm_items: Sequence[MultiModalItem] = (),
    start: int = 0,
) -> list[BlockHash]:
    """The hashes of the full blocks of `token_ids`, chained on from `parent` (the hash of the block
    before them; the root for a sequence's start). A partial last block has none.

    `start`: the position of `token_ids[0]` in its sequence; `mm_items`: the sequence's images. A block
    overlapping an image hashes the image's `mm_hash` too (vLLM's extra keys), since every image's
    placeholders are the same token IDs::

        tokens  [ text  |<pad><pad>|<pad> text ]     image at offset 6, 5 tokens; blocks of 8
        block      0: H(parent || mm || tokens)      1: H(h0 || mm || tokens)
    """
    num_full = len(token_ids) // block_size
    data = bytes_of(token_ids, 0, num_full * block_size)
    step = 4 * block_size
    blocks = [data[at : at + step] for at in range(0, len(data), step)]
    if mm_items:  # each block overlapping images hashes their mm_hash first (none: every prompt block)
        blocks = [_image_keys(mm_items, start + i * block_size, block_size) + b for i, b in enumerate(blocks)]
    hashes = []
    for block in blocks:
        parent = xxhash.xxh3_128_digest(parent + block)
        hashes.append(parent)
    return hashes


def _image_keys(mm_items: Sequence[MultiModalItem], lo: int, block_size: int) -> bytes:
    """The `mm_hash`es of the images overlapping the block of positions [lo, lo + block_size)."""
    return b"".join(
        bytes.fromhex(m.mm_hash)
        for m in mm_items
        if m.offset < lo + block_size and lo < m.offset + m.num_tokens
    )
