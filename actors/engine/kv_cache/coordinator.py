"""The engine's KV cache (vLLM's `KVCacheCoordinator`): one `BlockPool`, and a manager per kind of KV
the model has (`manager.py`), asked in turn. The scheduler, the connectors and the windows of steps ask
the coordinator; only the managers know the kinds.

    KVCacheCoordinator ─┬─ BlockPool (free queue, holds, the caches by block hash)
                        ├─ the specs' managers (MambaStateManager: a hybrid's SSM states;
                        │   SlidingWindowManager: sliding-window layers' blocks), then
                        └─ FullAttentionManager (block_ids, prefix cache)

Managers take blocks in that order and free them in the reverse one.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import Any

from actors.engine.kv_cache.block_hash import BlockHash
from actors.engine.kv_cache.block_pool import BlockPool
from actors.engine.kv_cache.full_attention import FullAttentionManager
from actors.engine.kv_cache.manager import KVCacheManager, KVCacheSpec
from actors.engine.kv_cache.step_blocks import new_block_runs, num_new_blocks
from actors.engine.request import Request
from messages import KVEvents


class KVCacheCoordinator:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        *,
        specs: Sequence[KVCacheSpec] = (),
    ) -> None:
        """`specs`: the model's kinds of KV beside full attention (a hybrid's `MambaStateSpec`)."""
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, block_size)
        self.attention = FullAttentionManager(self.pool, block_size, enable_prefix_caching)
        self._others = [spec.manager(self.pool, block_size, enable_prefix_caching) for spec in specs]
        self.managers: list[KVCacheManager] = [*self._others, self.attention]
        """Every kind's manager, in the order they take blocks (a Mamba checkpoint is read before any
        take can evict it)."""
        self._freeing = self.managers[::-1]
        self.keeps_hit_without_load = all(m.keeps_hit_without_load for m in self.managers)
        """Whether a request whose remote KV failed to load keeps its local prefix hit."""
        self.num_blocks_per_position = 1 + sum(m.num_blocks_per_position for m in self._others)
        """Blocks a request takes for each block of new tokens, every kind's (a window of steps counts)."""
        self.num_prefix_cache_queries = 0
        """Prompt tokens looked up in the prefix cache (vLLM's prefix_cache_queries)."""
        self.num_prefix_cache_hits = 0

    def publish_kv_events(self) -> None:
        """Record every block stored in and evicted from the prefix cache (for a KV-aware router)."""
        self.pool.publish_kv_events()

    @property
    def publishes_kv_events(self) -> bool:
        return self.pool.publishes_kv_events

    def take_kv_events(self) -> KVEvents | None:
        """The changes since the last call, or None (none, or events off)."""
        return self.pool.take_kv_events()

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.pool.usage

    def block_hashes(self, req: Request, num_blocks: int) -> list[BlockHash]:
        """The chained hashes of `req`'s first `num_blocks` full blocks; none without prefix caching."""
        return self.attention.block_hashes(req, num_blocks)

    def get_computed_blocks(self, req: Request) -> list[int]:
        """The blocks of the longest cached prefix of `req`'s tokens that every kind holds (`block_size`
        tokens each), touched by nothing: a request that is not admitted leaves them where they are in
        the free queue, as vLLM's `get_computed_blocks` leaves them until `allocate_slots` takes them.
        At least one token is always left to compute, since the next token needs logits. Each kind cuts
        the hit in turn until none cuts it further (vLLM's hybrid coordinator)."""
        hits = self.attention.find_longest_cache_hit(req)
        num_before = -1
        while hits and len(hits) != num_before:
            num_before = len(hits)
            for manager in self._others:
                hits = hits[: manager.num_hit_blocks(req, hits)]
        return hits

    def record_prefix_cache_stats(self, req: Request, num_hit_tokens: int) -> None:
        """Count an admitted request's lookup (vLLM records at admission, so a request that waits is
        counted once, and a preempted one coming back is not counted again)."""
        if self.enable_prefix_caching and req.times.num_preemptions == 0:
            self.num_prefix_cache_queries += req.num_tokens
            self.num_prefix_cache_hits += num_hit_tokens

    def allocate_slots(
        self,
        req: Request,
        num_new_tokens: int,
        new_computed_blocks: list[int] | None = None,
        *,
        num_external_computed_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        delay_cache_blocks: bool = False,
    ) -> bool:
        """Give `req` blocks for its `num_computed_tokens` (which count `new_computed_blocks`, its prefix
        hit, when it has one), the `num_external_computed_tokens` whose KV comes from elsewhere, and
        `num_new_tokens`; False if the free blocks are short (nothing changed but blocks that left a
        sliding window, freed first as vLLM frees them). As vLLM's `allocate_slots`: a hit block that
        is free counts as one to take (it leaves the free queue); `full_sequence_must_fit`: the whole
        sequence must fit, not only this chunk (the admission gate of `scheduler.reserve_full_isl`);
        the full blocks this step will have computed are cached now, so a request admitted later in the
        same step hits them, unless `delay_cache_blocks` (KV that arrives from another engine later)::

            block_ids  | held | new_computed_blocks | external |     new      |
            tokens     | <- num_computed_tokens ->  |          |              |
                       | <------- computed before the step --> | <- to run -> |
                                                    (full_sequence_must_fit: up to num_tokens)
        """
        num_computed = req.num_computed_tokens + num_external_computed_tokens
        end = num_computed + num_new_tokens
        hits = new_computed_blocks or []
        if (
            not (hits or full_sequence_must_fit or self._others)
            and end <= len(req.block_ids) * self.block_size
        ):
            if not delay_cache_blocks:  # (the usual decode: full attention alone, inside its blocks)
                self.attention.cache_blocks(req, end)
            return True
        managers = self.managers
        for m in self._others:
            m.remove_skipped_blocks(req, num_computed)
        need = sum(m.num_blocks_to_allocate(req, hits, num_computed, end) for m in managers)
        num_free = self.pool.num_free_blocks
        if need > num_free:
            return False
        if full_sequence_must_fit:
            num_after = sum(m.num_blocks_after(req, hits, num_computed, end) for m in managers)
            if need + num_after > num_free:
                return False
        for m in managers:
            m.allocate_new_computed_blocks(req, hits, num_computed)
        for m in managers:
            m.allocate_new_blocks(req, end)
        if not delay_cache_blocks:
            for m in managers:
                m.cache_blocks(req, end)
        return True

    def num_steps_with_blocks(self, requests: list[Request], chunks: list[int], num_steps: int) -> int:
        """Of a window's next `num_steps` steps (`step_blocks`), how many the free blocks last for (a
        step short of blocks would preempt): each new block of tokens takes a block of every kind
        (`num_blocks_per_position`); blocks a sliding window frees meanwhile are not counted, so a
        window may end before blocks would run short."""
        bs, per_position = self.block_size, self.num_blocks_per_position
        if num_new_blocks(requests, chunks, bs, num_steps) * per_position <= self.num_free_blocks:
            return num_steps  # counted, not listed: the usual case
        runs = new_block_runs(requests, chunks, bs, num_steps)
        counts = list(itertools.accumulate(n * per_position for _, _, n in runs))
        return runs[bisect.bisect_right(counts, self.num_free_blocks)][0]  # it misses a block: not run

    def allocate_steps(self, requests: list[Request], chunks: list[int], num_steps: int) -> None:
        """The allocations of a window's steps after its first (`step_blocks`), in the order a step at
        a time makes them (they fit: `num_steps_with_blocks`). Where no kind of KV frees blocks meanwhile
        the new blocks are taken at once; else each allocation that changes blocks is made as that
        step's schedule made it: with the tokens computed before the step."""
        runs = new_block_runs(requests, chunks, self.block_size, num_steps)
        events = self._steps_changing_blocks(requests, chunks, num_steps)
        if not events:
            self.attention.append_block_runs([(requests[r], n) for _, r, n in runs])
            return
        for i, r in sorted(events.union((i, r) for i, r, _ in runs)):
            req = requests[r]
            computed = req.num_computed_tokens
            chunked = bool(chunks) and r == len(requests) - 1
            req.num_computed_tokens = computed + (sum(chunks[:i]) if chunked else i)
            end = req.num_computed_tokens + (chunks[i] if chunked else 1)
            for m in self._others:
                m.remove_skipped_blocks(req, req.num_computed_tokens)
            for m in self.managers:
                m.allocate_new_blocks(req, end)
            for m in self.managers:
                m.cache_blocks(req, end)
            req.num_computed_tokens = computed

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        """Publish the full blocks among `req`'s first `num_tokens` tokens to the prefix cache (every
        kind what a later prompt can hit)."""
        for m in self.managers:
            m.cache_blocks(req, num_tokens)

    def on_step_done(self, requests: list[Request]) -> None:
        """`requests` computed a step."""
        for manager in self._others:
            manager.on_step_done(requests)

    def state_block(self, req: Request) -> int | None:
        """The block of `req`'s running recurrent state, where a kind keeps one (a hybrid's SSM state:
        what a P/D handoff moves beside its KV); None otherwise."""
        return next((b for m in self._others if (b := m.state_block(req)) is not None), None)

    def runner_fields(self, req: Request, num_new_tokens: int) -> dict[str, Any]:
        """What the runner needs of every kind for `req`'s step of `num_new_tokens` beyond its
        full-attention blocks (`RunnerInput`'s fields: a hybrid's state blocks)."""
        fields: dict[str, Any] = {}
        for manager in self._others:
            fields |= manager.runner_fields(req, num_new_tokens)
        return fields

    def align_chunk(self, req: Request, num_new_tokens: int) -> int:
        """Of `num_new_tokens` the budget gives `req` this step, those every kind lets it compute (a
        hybrid's prompt chunks end on block boundaries)."""
        for manager in self._others:
            num_new_tokens = manager.align_chunk(req, num_new_tokens)
        return num_new_tokens

    def steady(self, requests: list[Request], chunked: bool) -> bool:
        """Whether `requests`' blocks change over the next steps only by new full-attention blocks for
        their new tokens, the last one computing prompt chunks where `chunked` (a window of steps)."""
        return all(m.steady(requests, chunked) for m in self._others)

    def _steps_changing_blocks(
        self, requests: list[Request], chunks: list[int], num_steps: int
    ) -> set[tuple[int, int]]:
        """(step, request index) of a window of `num_steps` steps at which a kind of KV changes a
        request's blocks beyond taking new ones (a sliding window freeing)."""
        decodes = requests[:-1] if chunks else requests
        events: set[tuple[int, int]] = set()
        for manager in self._others:
            for r, req in enumerate(decodes):
                events.update(
                    (i, r) for i in manager.decode_steps_changing(req.num_computed_tokens, num_steps)
                )
            if chunks:
                computed = list(
                    itertools.accumulate(chunks[: num_steps - 1], initial=requests[-1].num_computed_tokens)
                )
                events.update((i, len(requests) - 1) for i in manager.steps_changing(computed))
        return events

    def free(self, req: Request) -> None:
        """Drop `req`'s hold on its blocks, every kind's (see `FullAttentionManager.free`)."""
        for manager in self._freeing:
            manager.free(req)

    def assert_empty(self) -> None:
        for manager in self.managers:
            manager.assert_empty()
        self.pool.assert_empty()
