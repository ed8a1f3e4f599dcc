"""Full-attention KV (vLLM's `FullAttentionManager`): a request holds a block for every `block_size`
tokens, shares its prefix through the `PrefixIndex`, and keeps every block until it ends.

A block's hash covers its own tokens *and* every token before it (`block_hash`), so a changed history
changes every later hash. Freed blocks keep their hash and stay findable until they are reused: the
free queue is LRU, and a request frees its blocks tail first so that the prefix it shares with others is
evicted last.
"""

from __future__ import annotations

from actors.engine.kv_cache.block_hash import BlockHash
from actors.engine.kv_cache.manager import KVCacheManager
from actors.engine.request import Request
from emulation.kv_cache import cdiv


class FullAttentionManager(KVCacheManager):
    def block_hashes(self, req: Request, num_blocks: int) -> list[BlockHash]:
        """The chained hashes of `req`'s first `num_blocks` full blocks (hashed now where they were not
        yet); none without prefix caching."""
        return self.pool.prefix_index.block_hashes(req, num_blocks) if self.enable_prefix_caching else []

    def find_longest_cache_hit(self, req: Request) -> list[int]:
        """The blocks of the longest cached prefix of `req`'s tokens, at least one token left to compute."""
        return self.pool.prefix_index.find(req) if self.enable_prefix_caching else []

    def num_blocks_to_allocate(
        self, req: Request, hits: list[int], num_computed_tokens: int, end: int
    ) -> int:
        num_held = len(req.block_ids) + len(hits)
        return cdiv(end, self.block_size) - num_held + self.pool.num_free_among(hits)

    def num_blocks_after(self, req: Request, hits: list[int], num_computed_tokens: int, end: int) -> int:
        return cdiv(req.num_tokens, self.block_size) - cdiv(end, self.block_size)

    def allocate_new_computed_blocks(self, req: Request, hits: list[int], num_computed_tokens: int) -> None:
        if hits:
            self.pool.touch(hits)
            req.block_ids = list(hits)
            req.num_published_blocks = len(hits)

    def allocate_new_blocks(self, req: Request, end: int) -> None:
        need = cdiv(end, self.block_size) - len(req.block_ids)
        if need > 0:
            req.block_ids += self.pool.take(need)

    def append_block_runs(self, runs: list[tuple[Request, int]]) -> None:
        """Give each run's request its next `count` least recently used free blocks, run after run (as
        many `allocate_new_blocks` would, in one)."""
        new = self.pool.take(sum(count for _, count in runs))
        at = 0
        for req, count in runs:
            req.block_ids += new[at : at + count]
            at += count

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        """Publish the full blocks among `req`'s first `num_tokens` tokens (their KV computed, or being
        computed by the step that scheduled them) to the prefix cache."""
        if self.enable_prefix_caching:
            self.pool.prefix_index.publish(req, num_tokens)

    def free(self, req: Request) -> None:
        """Drop `req`'s hold on its blocks; those nobody else holds go to the free queue, tail first: its
        unpublished blocks (no hash: a partly filled last block, blocks not computed, every block without
        prefix caching) to the front, reused first, its published ones to the LRU end, evicted last
        (vLLM's `free_blocks`: blocks without a hash are prepended, hashed ones appended)."""
        index, free_queue = self.pool.prefix_index, self.pool.free_queue
        num_published = req.num_published_blocks
        start = index.unhashed_start(req)
        # Its blocks from its unhashed sequence on were never cached: it alone holds them.
        cut = num_published if start is None else start
        unused = self.pool.drop_holds(req.block_ids[:cut][::-1])
        free_queue.push_front(req.block_ids[num_published:][::-1])
        own = req.block_ids[cut:num_published][::-1]
        at = free_queue.push(own + unused)
        if start is not None:  # its first block's entry is the last of its own
            index.freed(req, at + len(own))
        req.block_ids = []
        req.num_published_blocks = 0
