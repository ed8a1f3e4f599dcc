"""A hybrid model's cached SSM states (vLLM's MambaManager in align mode, prefix caching on).

A state summarises every token before it and cannot be cut, so vLLM caches it only where a prefix can
end: at a block boundary, under the chained hash of the block it ends. With vLLM's default retention,
only one boundary a prompt is kept, its checkpoint: the last block boundary before its last token
(`checkpoint_position`), the furthest a later prompt sharing it can reuse (a hit leaves one token to
compute)::

    prompt     [ block 0 | block 1 | block 2 | 3 ... ]  N tokens, block_size bs
    checkpoint                               ^ P = floor((N - 1) / bs) · bs   (none when P = 0)
    a hit      attention blocks 0 .. i-1 cached AND a state cached at i · bs: the largest such i

A cached state takes one block in each Mamba group (the same hash in all: they are written together).
Its blocks are freed blocks like evicted KV: reused least recently used first, the entry forgotten then.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

from actors.engine.kv_cache.block_hash import BlockHash


def checkpoint_position(num_prompt_tokens: int, block_size: int) -> int:
    """Where a prompt's state is cached: its last block boundary before its last token (0: none)."""
    return (num_prompt_tokens - 1) // block_size * block_size


class StateCache:
    """Cached states by the hash of the block they end: each one block a Mamba group."""

    def __init__(self) -> None:
        self._cached: dict[BlockHash, list[int]] = {}
        self._hash_of: dict[int, BlockHash] = {}

    def get(self, block_hash: BlockHash) -> list[int] | None:
        return self._cached.get(block_hash)

    def longest_hit(self, hashes: Sequence[BlockHash], num_blocks: int) -> int:
        """The most of the first `num_blocks` blocks (`hashes` theirs) whose end has a cached state."""
        return next((i for i in range(num_blocks, 0, -1) if hashes[i - 1] in self._cached), 0)

    def put(self, block_hash: BlockHash, block_ids: list[int]) -> bool:
        """Cache a state in `block_ids`; False (nothing changed) if one is cached there already."""
        if block_hash in self._cached:
            return False
        self._cached[block_hash] = block_ids
        self._hash_of.update(zip(block_ids, repeat(block_hash)))
        return True

    def forget(self, block_ids: list[int]) -> None:
        """`block_ids` are being reused: a state they held is gone (all of its blocks)."""
        if not self._hash_of:
            return
        for block in block_ids:
            block_hash = self._hash_of.pop(block, None)
            if block_hash is not None:
                for other in self._cached.pop(block_hash):
                    self._hash_of.pop(other, None)

    def __len__(self) -> int:
        return len(self._cached)
