"""Paged KV blocks with a prefix cache keyed by chained block hashes (vLLM v1 semantics).

A block's hash covers its own tokens *and* every token before it (`block_hash`), so a changed history
changes every later hash. Freed blocks keep their hash and stay findable until they are reused: the
free queue is LRU, and a request frees its blocks tail first so that the prefix it shares with others is
evicted last. Which block holds which hash is the `PrefixIndex`'s (hashed only when it can matter).

A hybrid model's blocks (`num_state_groups` > 0: vLLM's hybrid KV cache manager, one pool of one page
size) also hold SSM states: each request holds a running-state block in each Mamba group from its first
allocation on (`Request.state_block_ids`: the state as of its last computed token, what a P/D handoff
ships), and with prefix caching (vLLM's align mode) the state at its prompt's checkpoint is cached
(`state_cache.py`); a hit reaches only as far as a cached state does, and holds that state's blocks
until its first step has read them.
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import add, not_

from actors.engine.block_hash import BlockHash
from actors.engine.free_queue import FreeQueue
from actors.engine.prefix_index import PrefixIndex
from actors.engine.request import Request
from actors.engine.state_cache import StateCache, checkpoint_position
from emulation.kv_cache import cdiv
from messages import KVEvents


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool, *, num_state_groups: int = 0
    ) -> None:
        """`num_state_groups`: a hybrid model's Mamba groups (`ModelProfile.kv_cache_groups`; 0: none)."""
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.num_state_groups = num_state_groups
        self._states = StateCache()
        """Hybrid models with prefix caching: prompt states cached at their checkpoints."""
        self._free = FreeQueue(num_blocks)
        self._ref_cnt: dict[int, int] = {}
        """block id -> the requests holding it, for cached blocks in use: only those can be shared (a
        hit takes a cached block); any other held block has exactly one holder."""
        self._index = PrefixIndex(block_size, self._free, self._ref_cnt)
        self.num_prefix_cache_queries = 0
        """Prompt tokens looked up in the prefix cache (vLLM's prefix_cache_queries)."""
        self.num_prefix_cache_hits = 0

    def publish_kv_events(self) -> None:
        """Record every block stored in and evicted from the prefix cache (for a KV-aware router)."""
        self._index.publish_kv_events()

    @property
    def publishes_kv_events(self) -> bool:
        return self._index.publishes_kv_events

    def take_kv_events(self) -> KVEvents | None:
        """The changes since the last call, or None (none, or events off)."""
        return self._index.take_kv_events()

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def block_hashes(self, req: Request, num_blocks: int) -> list[BlockHash]:
        """The chained hashes of `req`'s first `num_blocks` full blocks (hashed now where they were not
        yet); none without prefix caching."""
        return self._index.block_hashes(req, num_blocks) if self.enable_prefix_caching else []

    def get_computed_blocks(self, req: Request) -> list[int]:
        """The blocks of the longest cached prefix of `req`'s tokens (`block_size` tokens each), touched
        by nothing: a request that is not admitted leaves them where they are in the free queue, as
        vLLM's `get_computed_blocks` leaves them until `allocate_slots` takes them.

        At least one token is always left to compute, since the next token needs logits. A hybrid
        model's hit ends where a state is cached (vLLM: the Mamba hit within the attention hit), but
        for a request whose state comes from a prefill engine (`_state_comes_with_kv`).
        """
        if not self.enable_prefix_caching:
            return []
        hits = self._index.find(req)
        if self.num_state_groups and hits and not self._state_comes_with_kv(req, len(hits)):
            return hits[: self._states.longest_hit(req.block_hashes, len(hits))]
        return hits

    def _state_comes_with_kv(self, req: Request, num_hit_blocks: int) -> bool:
        """Whether a hybrid request's state will arrive from a prefill engine: it awaits remote KV beyond
        its hit of `num_hit_blocks` (vLLM's NIXL connector moves the state unconditionally; a hit that
        leaves nothing to load falls back to a hit on its own cached state, as vLLM's does)."""
        waiting = req.is_remote_prefill and not req.remote_kv_loaded
        return waiting and num_hit_blocks * self.block_size < req.remote_kv_end

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
        full_sequence_must_fit: bool = False,
        delay_cache_blocks: bool = False,
    ) -> bool:
        """Give `req` blocks for its `num_computed_tokens` (which count `new_computed_blocks`, its prefix
        hit, when it has one) plus `num_new_tokens`; False, nothing changed, if the free blocks are short.
        As vLLM's `allocate_slots`: a hit block that is free counts as one to take (it leaves the free
        queue); `full_sequence_must_fit`: the whole sequence must fit, not only this chunk (the admission
        gate of `scheduler.reserve_full_isl`); the full blocks this step will have computed are cached
        now, so a request admitted later in the same step hits them, unless `delay_cache_blocks` (KV
        that arrives from another engine later)::

            block_ids  | held | new_computed_blocks |      to allocate       |
            tokens     | <- num_computed_tokens ->  | <- num_new_tokens ->   |
                                                   (full_sequence_must_fit: up to num_tokens)
        """
        end = req.num_computed_tokens + num_new_tokens
        no_hit_nor_state = not (new_computed_blocks or full_sequence_must_fit or self.num_state_groups)
        if no_hit_nor_state and end <= len(req.block_ids) * self.block_size:  # (the usual decode)
            if not delay_cache_blocks:
                self.cache_blocks(req, end)
            return True
        hits = new_computed_blocks or []
        num_held = len(req.block_ids) + len(hits)
        state_hit = self._state_hit(req, hits)
        checkpoint = self._checkpoint_in(req, end)
        g = self.num_state_groups  # a hybrid's new state blocks: running ones at first, its checkpoint's
        num_states = g * (not req.state_block_ids) + g * (checkpoint is not None)
        touched = hits + state_hit
        num_free = len(self._free) - (len(touched) - sum(map(self._ref_cnt.__contains__, touched)))
        num_free -= num_states
        if full_sequence_must_fit and cdiv(req.num_tokens, self.block_size) - num_held > num_free:
            return False
        need = cdiv(end, self.block_size) - num_held
        if need > num_free:
            return False
        if hits:
            self._touch(touched)
            req.block_ids = list(hits)
            req.num_published_blocks = len(hits)
            req.state_hold = state_hit
        if g and not req.state_block_ids:
            req.state_block_ids = self._take(g)
        if checkpoint is not None:
            req.checkpoint = (checkpoint, self._take(g))
        if need > 0:
            req.block_ids += self._take(need)
        if not delay_cache_blocks:
            self.cache_blocks(req, end)
        return True

    def _state_hit(self, req: Request, hits: list[int]) -> list[int]:
        """The blocks of the state cached where a hybrid's prefix hit `hits` ends (none otherwise)."""
        if not (self.num_state_groups and hits) or self._state_comes_with_kv(req, len(hits)):
            return []
        return list(self._states.get(req.block_hashes[len(hits) - 1]) or ())

    def _checkpoint_in(self, req: Request, end: int) -> int | None:
        """A hybrid's prompt checkpoint with prefix caching, if a step computing up to `end` reaches it
        first and no state is cached there yet (None otherwise)."""
        if not (self.num_state_groups and self.enable_prefix_caching) or req.checkpoint is not None:
            return None
        if req.is_remote_prefill and not req.remote_kv_loaded:  # it loads its prompt, never computes it
            return None
        at = checkpoint_position(req.num_prompt_tokens, self.block_size)
        if not at or not req.num_computed_tokens < at <= end:
            return None
        num = at // self.block_size
        return at if self._states.get(self.block_hashes(req, num)[num - 1]) is None else None

    def on_step_done(self, req: Request) -> None:
        """`req` computed a step (hybrid models): the hit state it read is released, and the state at
        its checkpoint, once computed, is cached (its blocks free and findable, as vLLM frees them)."""
        if req.state_hold:
            self._release(req.state_hold)
            req.state_hold = []
        if req.checkpoint is not None and req.num_computed_tokens >= req.checkpoint[0]:
            at, ids = req.checkpoint
            req.checkpoint = None
            num = at // self.block_size
            if self._states.put(self.block_hashes(req, num)[num - 1], ids):
                self._free.push(ids)
            else:  # another request cached this boundary first
                self._free.push_front(ids)

    def _release(self, blocks: list[int]) -> None:
        """Drop one hold on cached `blocks`; those nobody holds go to the free queue's LRU end."""
        unused = []
        for block in blocks:
            n = self._ref_cnt[block] - 1
            if n:
                self._ref_cnt[block] = n
            else:
                del self._ref_cnt[block]
                unused.append(block)
        self._free.push(unused)

    def append_block_runs(self, runs: list[tuple[Request, int]]) -> None:
        """Give each run's request its next `count` least recently used free blocks, run after run (as
        many `allocate_slots` would, in one)."""
        new = self._take(sum(count for _, count in runs))
        at = 0
        for req, count in runs:
            req.block_ids += new[at : at + count]
            at += count

    def _take(self, count: int) -> list[int]:
        """The `count` least recently used free blocks, the hashes they were cached under forgotten."""
        new = self._free.pop_oldest(count)
        self._index.forget(new)
        if self.num_state_groups:
            self._states.forget(new)
        return new

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        """Publish the full blocks among `req`'s first `num_tokens` tokens (their KV computed, or being
        computed by the step that scheduled them) to the prefix cache."""
        if self.enable_prefix_caching:
            self._index.publish(req, num_tokens)

    def free(self, req: Request) -> None:
        """Drop `req`'s hold on its blocks; those nobody else holds go to the free queue, tail first: its
        unpublished blocks (no hash: a partly filled last block, blocks not computed, every block without
        prefix caching) to the front, reused first, its published ones to the LRU end, evicted last
        (vLLM's `free_blocks`: blocks without a hash are prepended, hashed ones appended)."""
        num_published = req.num_published_blocks
        start = self._index.unhashed_start(req)
        # Its blocks from its unhashed sequence on were never cached: it alone holds them.
        cut = num_published if start is None else start
        ids = req.block_ids[:cut][::-1]
        held = list(map(self._ref_cnt.pop, ids, repeat(1)))
        unused = ids
        if max(held, default=1) > 1:  # shared through the prefix cache: the others keep theirs
            unused = []
            for block, n in zip(ids, held, strict=True):
                if n > 1:
                    self._ref_cnt[block] = n - 1
                else:
                    unused.append(block)
        self._free.push_front(req.block_ids[num_published:][::-1])
        own = req.block_ids[cut:num_published][::-1]
        at = self._free.push(own + unused)
        if start is not None:  # its first block's entry is the last of its own
            self._index.freed(req, at + len(own))
        req.block_ids = []
        req.num_published_blocks = 0
        if self.num_state_groups:
            self._free_states(req)

    def _free_states(self, req: Request) -> None:
        """A hybrid request's state blocks: its running states and a checkpoint not reached (never
        cached: reused first); a hit state it still holds is released."""
        self._free.push_front(req.state_block_ids + (req.checkpoint[1] if req.checkpoint else []))
        req.state_block_ids = []
        req.checkpoint = None
        if req.state_hold:
            self._release(req.state_hold)
            req.state_hold = []

    def _touch(self, blocks: list[int]) -> None:
        """Hold `blocks` (distinct) once more; those free leave the free queue."""
        held = list(map(self._ref_cnt.get, blocks, repeat(0)))
        self._free.remove(list(compress(blocks, map(not_, held))))
        self._ref_cnt.update(zip(blocks, map(add, held, repeat(1)), strict=True))

    def assert_empty(self) -> None:
        held = list(self._ref_cnt)
        assert not held, f"blocks still referenced: {held[:10]} ({len(held)} in all)"
        self._index.assert_empty()
        assert len(self._free) == self.num_blocks, "free queue lost blocks"
