"""Paged KV blocks with a prefix cache keyed by chained block hashes (vLLM v1 semantics).

A block's hash covers its own tokens *and* every token before it (`block_hash`), so a changed history
changes every later hash. Freed blocks keep their hash and stay findable until
they are reused: the free queue is LRU, and a request frees its blocks tail first so that the
prefix it shares with others is evicted last.
"""

from __future__ import annotations

from collections import OrderedDict

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
        self._ref_cnt = [0] * num_blocks
        self._hash_of: list[BlockHash | None] = [None] * num_blocks
        self._cached: dict[BlockHash, int] = {}
        """block hash -> block id, for full blocks whose KV is computed."""
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
        the hashes they held: a prompt's blocks at once, one loop each."""
        new = self._free.pop_oldest(count)
        hash_of, cached, events = self._hash_of, self._cached, self._events
        for block in new:
            h = hash_of[block]
            if h is not None:  # reused: its prefix-cache entry goes, if it is the one
                if cached.get(h) == block:
                    del cached[h]
                    if events is not None:
                        events[h] = False
                hash_of[block] = None
        ref_cnt = self._ref_cnt
        for block in new:
            ref_cnt[block] = 1
        req.block_ids += new

    def cache_full_blocks(self, req: Request) -> None:
        """Publish the full blocks of `req` whose KV is now computed."""
        if not self.enable_prefix_caching:
            return
        num_full = req.num_computed_tokens // self.block_size
        if num_full <= req.num_published_blocks:
            return
        self._extend_hashes(req, req.num_computed_tokens)
        hash_of, setdefault, events = self._hash_of, self._cached.setdefault, self._events
        lo = req.num_published_blocks
        for block, h in zip(req.block_ids[lo:num_full], req.block_hashes[lo:num_full], strict=True):
            if hash_of[block] is None:
                hash_of[block] = h
                if setdefault(h, block) == block and events is not None:
                    events[h] = True
        req.num_published_blocks = num_full

    def free(self, req: Request) -> None:
        ref_cnt, unused = self._ref_cnt, []
        for block in reversed(req.block_ids):
            ref_cnt[block] -= 1
            if not ref_cnt[block]:
                unused.append(block)
        self._free.push(unused)  # to the LRU end, tail first
        req.block_ids = []
        req.num_published_blocks = 0

    def _touch(self, block: int) -> None:
        if self._ref_cnt[block] == 0:
            self._free.remove(block)
        self._ref_cnt[block] += 1

    def assert_empty(self) -> None:
        held = [b for b, n in enumerate(self._ref_cnt) if n]
        assert not held, f"blocks still referenced: {held[:10]} ({len(held)} in all)"
        assert len(self._free) == self.num_blocks, "free queue lost blocks"


class FreeQueue:
    """The free blocks, least recently used first: those never used (in id order, not materialised, so
    a pool of any size costs nothing to build) ahead of those freed since (oldest first)."""

    def __init__(self, num_blocks: int) -> None:
        self._next_unused, self._num_blocks = 0, num_blocks
        self._freed: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return self._num_blocks - self._next_unused + len(self._freed)

    def pop_oldest(self, count: int) -> list[int]:
        """The `count` least recently used blocks (there must be as many), taken out."""
        unused = min(count, self._num_blocks - self._next_unused)
        blocks = list(range(self._next_unused, self._next_unused + unused))
        self._next_unused += unused
        pop = self._freed.popitem
        return blocks + [pop(last=False)[0] for _ in range(count - unused)]

    def push(self, blocks: list[int]) -> None:
        """Free `blocks`, most recently used last."""
        self._freed.update(dict.fromkeys(blocks))

    def remove(self, block: int) -> None:
        """Take out a freed block that is in use again (a prefix-cache hit)."""
        del self._freed[block]
