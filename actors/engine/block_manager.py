"""Paged KV blocks with a prefix cache keyed by chained block hashes (vLLM v1 semantics).

A block's hash covers its own tokens *and* every token before it (`block_hash`), so a changed history
changes every later hash. Freed blocks keep their hash and stay findable until
they are reused: the free queue is LRU, and a request frees its blocks tail first so that the
prefix it shares with others is evicted last.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat

from actors.engine.block_hash import ROOT_BLOCK_HASH, BlockHash, hash_blocks
from actors.engine.request import Request
from messages import KVEvents
from target.kv_cache import cdiv


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._free = FreeQueue(num_blocks)
        self._ref_cnt: dict[int, int] = {}
        """block id -> the requests holding it, for blocks in use."""
        self._cached: dict[BlockHash, int] = {}
        """block hash -> block id, for full blocks whose KV is computed."""
        self._hash_of: dict[int, BlockHash] = {}
        """The inverse of `_cached`: the block a hash is cached under, to forget when it is reused."""
        self.num_prefix_cache_queries = 0
        """Prompt tokens looked up in the prefix cache (vLLM's prefix_cache_queries)."""
        self.num_prefix_cache_hits = 0
        self._events: dict[BlockHash, bool] | None = None
        """Net prefix-cache changes not yet published (hash -> stored), when KV events are on."""

    def publish_kv_events(self) -> None:
        """Record every block stored in and evicted from the prefix cache (for a KV-aware router)."""
        self._events = {}

    @property
    def publishes_kv_events(self) -> bool:
        return self._events is not None

    def take_kv_events(self) -> KVEvents | None:
        """The changes since the last call, or None (none, or events off)."""
        if not self._events:
            return None
        events = KVEvents(
            [h for h, s in self._events.items() if s], [h for h, s in self._events.items() if not s]
        )
        self._events = {}
        return events

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def _extend_hashes(self, req: Request, num_tokens: int) -> None:
        """Hash the full blocks among the first `num_tokens` tokens not hashed yet."""
        bs, hashes = self.block_size, req.block_hashes
        num_full = num_tokens // bs
        if num_full > len(hashes):
            tokens = req.token_ids(len(hashes) * bs, num_full * bs)
            parent = hashes[-1] if hashes else ROOT_BLOCK_HASH
            hashes += hash_blocks(tokens, bs, parent, req.mm_items, len(hashes) * bs)

    def get_computed_blocks(self, req: Request) -> int:
        """Attach the longest cached prefix of `req`'s tokens to it; returns the tokens it covers.

        At least one token is always left to compute, since the next token needs logits.
        """
        if not self.enable_prefix_caching:
            return 0
        max_hit_tokens = req.num_tokens - 1
        self._extend_hashes(req, max_hit_tokens)
        hits: list[int] = []
        for h in req.block_hashes[: max_hit_tokens // self.block_size]:
            block = self._cached.get(h)
            if block is None:
                break
            hits.append(block)
        self.num_prefix_cache_queries += req.num_tokens
        self.num_prefix_cache_hits += len(hits) * self.block_size
        for block in hits:
            self._touch(block)
        req.block_ids = hits
        req.num_published_blocks = len(hits)
        return len(hits) * self.block_size

    def allocate_slots(self, req: Request, num_new_tokens: int) -> bool:
        """Give `req` blocks for num_computed_tokens + num_new_tokens; False (nothing changed) if short."""
        need = cdiv(req.num_computed_tokens + num_new_tokens, self.block_size) - len(req.block_ids)
        if need <= 0:
            return True
        if need > len(self._free):
            return False
        self.append_blocks(req, need)
        return True

    def append_blocks(self, req: Request, count: int) -> None:
        """Give `req` the `count` least recently used free blocks (there must be as many), forgetting
        the hashes they were cached under. Every per-block step is a builtin's loop (`map`, `dict`
        methods): a prompt's hundreds of blocks at C speed."""
        new = self._free.pop_oldest(count)
        if self._hash_of:
            gone = list(filter(None, map(self._hash_of.pop, new, repeat(None))))
            deque(map(self._cached.__delitem__, gone), maxlen=0)
            if self._events is not None:
                self._events.update(dict.fromkeys(gone, False))
        self._ref_cnt.update(dict.fromkeys(new, 1))
        req.block_ids += new

    def cache_full_blocks(self, req: Request) -> None:
        """Publish the full blocks of `req` whose KV is now computed (a hash already cached under
        another block, computed twice at once, stays with that block, as `setdefault` would)."""
        if not self.enable_prefix_caching:
            return
        num_full = req.num_computed_tokens // self.block_size
        lo = req.num_published_blocks
        if num_full <= lo:
            return
        self._extend_hashes(req, req.num_computed_tokens)
        new = dict(zip(req.block_hashes[lo:num_full], req.block_ids[lo:num_full], strict=True))
        for h in new.keys() & self._cached.keys():
            del new[h]
        self._cached.update(new)
        self._hash_of.update(zip(new.values(), new.keys(), strict=True))
        if self._events is not None:
            self._events.update(dict.fromkeys(new, True))
        req.num_published_blocks = num_full

    def free(self, req: Request) -> None:
        """Drop `req`'s hold on its blocks; those nobody else holds go to the free queue, tail first."""
        ids = req.block_ids[::-1]
        held = list(map(self._ref_cnt.pop, ids))
        unused = ids
        if max(held, default=1) > 1:  # shared through the prefix cache: the others keep theirs
            unused = []
            for block, n in zip(ids, held, strict=True):
                if n > 1:
                    self._ref_cnt[block] = n - 1
                else:
                    unused.append(block)
        self._free.push(unused)  # to the LRU end, tail first
        req.block_ids = []
        req.num_published_blocks = 0

    def _touch(self, block: int) -> None:
        n = self._ref_cnt.get(block, 0)
        if n == 0:
            self._free.remove(block)
        self._ref_cnt[block] = n + 1

    def assert_empty(self) -> None:
        held = list(self._ref_cnt)
        assert not held, f"blocks still referenced: {held[:10]} ({len(held)} in all)"
        assert len(self._free) == self.num_blocks, "free queue lost blocks"


class FreeQueue:
    """The free blocks, least recently used first: those never used (in id order, not materialised, so
    a pool of any size costs nothing to build) ahead of those freed since (oldest first).

    Freed blocks are a list read from `_head` on, so a request's blocks go in and come out by slices (an
    ordered dict costs ~100 ns a block). A block taken out of the middle (a prefix-cache hit on a freed
    block) stays in the list as a stale entry, skipped when its turn comes; it is always older than any
    later entry of the same block, so the first one met is the stale one::

        _queue  [ 7  3  9  3  4 ]      _stale {3: 1}: block 3 was hit, then freed again
                  ^_head                pop_oldest(3) -> [7, 9, 3]
    """

    def __init__(self, num_blocks: int) -> None:
        self._next_unused, self._num_blocks = 0, num_blocks
        self._queue: list[int] = []
        self._head = 0
        self._stale: dict[int, int] = {}
        """block id -> entries of it in the queue that no longer count (taken out by `remove`)."""
        self._num_stale = 0

    def __len__(self) -> int:
        return self._num_blocks - self._next_unused + len(self._queue) - self._head - self._num_stale

    def pop_oldest(self, count: int) -> list[int]:
        """The `count` least recently used blocks (there must be as many), taken out."""
        unused = min(count, self._num_blocks - self._next_unused)
        blocks = list(range(self._next_unused, self._next_unused + unused))
        self._next_unused += unused
        count -= unused
        if count and not self._num_stale:
            blocks += self._queue[self._head : self._head + count]
            self._head += count
        elif count:
            self._pop_skipping_stale(blocks, count)
        if self._head > 4096 and 2 * self._head > len(self._queue):
            del self._queue[: self._head]
            self._head = 0
        return blocks

    def _pop_skipping_stale(self, out: list[int], count: int) -> None:
        queue, stale = self._queue, self._stale
        while count:
            block = queue[self._head]
            self._head += 1
            if stale.get(block):
                stale[block] -= 1
                self._num_stale -= 1
                if not stale[block]:
                    del stale[block]
            else:
                out.append(block)
                count -= 1

    def push(self, blocks: list[int]) -> None:
        """Free `blocks`, most recently used last."""
        self._queue += blocks

    def remove(self, block: int) -> None:
        """Take out a freed block that is in use again (a prefix-cache hit)."""
        self._stale[block] = self._stale.get(block, 0) + 1
        self._num_stale += 1
