"""The engine's one pool of KV blocks (vLLM's `BlockPool`), shared by every kind of KV cache.

A block is free or held. A held block that the prefix cache shares is counted in `ref_cnt` (how many
requests hold it); any other held block has exactly one holder. A free block keeps what it cached (an
attention block its chained hash in the `PrefixIndex`, a state block or a sliding-window block its
place in a `StateCache`)
until it is taken again: `take` forgets it in both, as vLLM's `get_new_blocks` evicts a cached block
when it is reused.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import compress, repeat
from operator import add, not_

from actors.engine.kv_cache.free_queue import FreeQueue
from actors.engine.kv_cache.prefix_index import PrefixIndex
from actors.engine.kv_cache.state_cache import StateCache
from messages import KVEvents


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.free_queue = FreeQueue(num_blocks)
        self.ref_cnt: dict[int, int] = {}
        """block id -> the requests holding it, for cached blocks in use: only those can be shared (a
        hit takes a cached block); any other held block has exactly one holder."""
        self.prefix_index = PrefixIndex(block_size, self.free_queue, self.ref_cnt)
        """Attention blocks by chained block hash."""
        self.state_cache = StateCache()
        """SSM states by the hash of the block they end (hybrid models with prefix caching)."""
        self.window_cache = StateCache()
        """Sliding-window blocks by their block hash, a block a sliding group (those a hit can use)."""

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free_queue) / self.num_blocks

    def publish_kv_events(self) -> None:
        """Record every block stored in and evicted from the prefix cache (for a KV-aware router)."""
        self.prefix_index.publish_kv_events()

    @property
    def publishes_kv_events(self) -> bool:
        return self.prefix_index.publishes_kv_events

    def take_kv_events(self) -> KVEvents | None:
        """The changes since the last call, or None (none, or events off)."""
        return self.prefix_index.take_kv_events()

    def take(self, count: int) -> list[int]:
        """The `count` least recently used free blocks, what they cached forgotten."""
        new = self.free_queue.pop_oldest(count)
        self.prefix_index.forget(new)
        self.state_cache.forget(new)
        self.window_cache.forget(new)
        return new

    def num_free_among(self, blocks: Iterable[int]) -> int:
        """Of cached `blocks` (distinct), those nobody holds: a hit on one takes a free block."""
        blocks = list(blocks)
        return len(blocks) - sum(map(self.ref_cnt.__contains__, blocks))

    def touch(self, blocks: list[int]) -> None:
        """Hold cached `blocks` (distinct) once more; those free leave the free queue."""
        held = list(map(self.ref_cnt.get, blocks, repeat(0)))
        self.free_queue.remove(list(compress(blocks, map(not_, held))))
        self.ref_cnt.update(zip(blocks, map(add, held, repeat(1)), strict=True))

    def drop_holds(self, blocks: list[int]) -> list[int]:
        """Drop one hold on each of `blocks` (distinct; one not counted has one holder); returns those
        nobody holds now, in order (the caller frees them)."""
        held = list(map(self.ref_cnt.pop, blocks, repeat(1)))
        if max(held, default=1) == 1:  # the usual case: nobody else held any
            return blocks
        unused = []
        for block, n in zip(blocks, held, strict=True):
            if n > 1:  # shared through the prefix cache: the others keep theirs
                self.ref_cnt[block] = n - 1
            else:
                unused.append(block)
        return unused

    def free_blocks(self, blocks: list[int]) -> None:
        """Free `blocks` in eviction order (vLLM's `free_blocks`): those never cached to the front, reused
        first and in order; cached ones (held, so counted) lose a hold, and those nobody holds go to the
        LRU end, findable until reused."""
        cached = [b for b in blocks if b in self.ref_cnt]
        if not cached:
            self.free_queue.push_front(blocks)
            return
        held = set(cached)
        self.free_queue.push_front([b for b in blocks if b not in held])
        self.release(cached)

    def release(self, blocks: list[int]) -> None:
        """Drop one hold on cached `blocks`; those nobody holds go to the free queue's LRU end."""
        self.free_queue.push(self.drop_holds(blocks))

    def assert_empty(self) -> None:
        held = list(self.ref_cnt)
        assert not held, f"blocks still referenced: {held[:10]} ({len(held)} in all)"
        self.prefix_index.assert_empty()
        assert len(self.free_queue) == self.num_blocks, "free queue lost blocks"
