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
from messages.token_ids import TokenIds, bytes_of, span

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


def prompt_block_hashes(
    tokens: Sequence[int],
    block_size: int,
    lo: int,
    hi: int,
    parent: BlockHash = ROOT_BLOCK_HASH,
    mm_items: Sequence[MultiModalItem] = (),
) -> list[BlockHash]:
    """The hashes of full blocks `lo`..`hi`-1 of a prompt's `tokens`, chained on from `parent` (block
    `lo`-1's hash; the root for block 0): `hash_blocks` of them, read from the trace's memo where the
    prompt was drawn from a trace's hash IDs (`TraceBlocks`), so a trace's shared prefixes are hashed
    once in a run, not once per turn, engine and router. The same bytes either way, for a `parent`
    that is these tokens' own chain (the memo holds the chain from the root).
    """
    assert lo > 0 or parent == ROOT_BLOCK_HASH, "a prompt's chain starts at the root"
    trace = tokens.trace if isinstance(tokens, TokenIds) else None
    if trace is None or mm_items or trace.block_len % block_size:
        return hash_blocks(
            span(tokens, lo * block_size, hi * block_size), block_size, parent, mm_items, lo * block_size
        )
    per, memo = trace.block_len // block_size, trace.memo
    out: list[BlockHash] = []
    j = lo
    while j < hi:  # a trace block at a time: [first, end) of its engine blocks
        first = j - j % per
        end = min(hi, first + per)
        key = (trace.nodes[first // per], block_size)
        known = memo.get(key, ())
        if first + len(known) > j:  # the memo reaches past j
            taken = known[j - first : end - first]
            out += taken
            j += len(taken)
            if j == end:
                continue
        new = hash_blocks(
            span(tokens, j * block_size, end * block_size), block_size, out[-1] if out else parent
        )
        if first + len(known) == j:  # what it knew continues with these
            memo[key] = [*known, *new]
        out += new
        j = end
    return out


def _image_keys(mm_items: Sequence[MultiModalItem], lo: int, block_size: int) -> bytes:
    """The `mm_hash`es of the images overlapping the block of positions [lo, lo + block_size)."""
    return b"".join(
        bytes.fromhex(m.mm_hash)
        for m in mm_items
        if m.offset < lo + block_size and lo < m.offset + m.num_tokens
    )
