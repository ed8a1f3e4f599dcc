"""Chained block hashes, stable across processes and nodes (vLLM's `sha256` prefix-caching hash).

A block's hash covers its own tokens *and* every token before it::

    h0 = H(ROOT || tokens[0:16])   h1 = H(h0 || tokens[16:32])   h2 = H(h1 || tokens[32:48])

so a changed history changes every later hash. H is SHA-256 over the parent's digest and the block's
token IDs as little-endian uint32, the same bytes on every machine: a router (or another engine) can
compare hashes computed in other actors. Python's `hash` is not: it is salted per process.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

BlockHash = bytes

ROOT_BLOCK_HASH: BlockHash = hashlib.sha256(b"disagg-testbed prefix cache").digest()
"""The parent of a sequence's first block."""


def hash_block(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    return hashlib.sha256(parent + struct.pack(f"<{len(token_ids)}I", *token_ids)).digest()


def hash_blocks(
    token_ids: Sequence[int], block_size: int, parent: BlockHash = ROOT_BLOCK_HASH
) -> list[BlockHash]:
    """The hashes of the full blocks of `token_ids`, chained on from `parent` (the hash of the block
    before them; the root for a sequence's start). A partial last block has none."""
    hashes = []
    for i in range(len(token_ids) // block_size):
        parent = hash_block(parent, token_ids[i * block_size : (i + 1) * block_size])
        hashes.append(parent)
    return hashes
