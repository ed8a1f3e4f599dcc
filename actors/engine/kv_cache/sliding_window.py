"""Sliding-window attention KV (vLLM's `SlidingWindowManager`): a layer attends to the last W keys, so
the blocks that leave the window are freed while the request runs and replaced by null entries.

Positions and what is freed, W = 128 keys, block_size 16 (vLLM's `get_num_skipped_tokens`)::

    computed tokens c = 200:   skipped = max(0, c - W + 1) = 73 tokens  ->  73 // 16 = 4 whole blocks
    table     [ -  -  -  -  b4 b5 ... b12 ]     blocks 0..3 left the window: freed, null entries
    freeing   walks back from block 3 and stops at the first null one (freed by an earlier step)

A request's blocks are those of its window (and the step's new tokens), at most
`max_window_blocks` (vLLM's admission cap, `SlidingWindowSpec.max_admission_blocks_per_request`).

With prefix caching, vLLM's default retention (`prefix_cache_retention_interval` 0) caches a sliding
group's blocks only where a later prompt can resume: the `cdiv(W - 1, block_size)` blocks that end at
the prompt's replay boundaries (`floor((N - 1) / bs) · bs` for a resend, `floor(N / bs) · bs` for a
longer sibling). A hit needs that many contiguous cached blocks, searched from the right within the
full-attention hit (or a run from the first block, for a hit shorter than the window).

Each position holds a block in each of the `num_groups` sliding groups (the same window in all: they
move together).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

from actors.engine.kv_cache.block_pool import BlockPool
from actors.engine.kv_cache.manager import KVCacheManager
from actors.engine.request import Request
from emulation.kv_cache import cdiv, max_window_blocks

Slot = list[int] | None
"""One position of a request's table: a block in each sliding group, or None (left the window)."""


@dataclass(frozen=True)
class SlidingWindowSpec:
    """A model's sliding-window layers (`ModelProfile.sliding_window`, `kv_cache_groups`)."""

    sliding_window: int
    """Keys a query attends to at most (gpt-oss: 128)."""
    num_groups: int
    """Sliding-window KV cache groups (vLLM groups layers by page): a request holds a block in each for
    every position of its window."""
    max_num_batched_tokens: int
    """The step budget: with the window, how many blocks a request may hold at once (the admission cap)."""

    def __post_init__(self) -> None:
        if self.sliding_window < 1 or self.num_groups < 1 or self.max_num_batched_tokens < 1:
            raise ValueError(f"a sliding-window spec needs a window, groups and a budget, got {self}")

    def manager(self, pool: BlockPool, block_size: int, enable_prefix_caching: bool) -> SlidingWindowManager:
        return SlidingWindowManager(pool, block_size, enable_prefix_caching, self)


class SlidingWindowManager(KVCacheManager):
    def __init__(
        self, pool: BlockPool, block_size: int, enable_prefix_caching: bool, spec: SlidingWindowSpec
    ):
        super().__init__(pool, block_size, enable_prefix_caching)
        self.spec = spec
        self.window = spec.sliding_window
        self.num_hit_blocks_needed = cdiv(self.window - 1, block_size)
        """Contiguous cached blocks a prefix hit needs (the window before the hit's end)."""
        self.admission_cap = max_window_blocks(self.window, block_size, spec.max_num_batched_tokens)
        self.num_blocks_per_position = spec.num_groups
        self._tables: dict[Request, list[Slot]] = {}
        self._cache = pool.window_cache
        self._num_cached: dict[Request, int] = {}
        """Leading positions of a request's table looked at for caching (vLLM's num_cached_block)."""

    def num_skipped_blocks(self, num_computed_tokens: int) -> int:
        """Whole blocks before the window of the next token after `num_computed_tokens`."""
        return max(0, num_computed_tokens - self.window + 1) // self.block_size

    def num_hit_blocks(self, req: Request, hits: list[int]) -> int:
        """The longest prefix of `hits` whose window's blocks are cached: `num_hit_blocks_needed`
        contiguous ones ending there, searched from the right, else a run from the first block."""
        need, run = self.num_hit_blocks_needed, 0
        for i in range(len(hits) - 1, -1, -1):
            if self._cache.get(req.block_hashes[i]) is None:
                run = 0
                continue
            run += 1
            if run >= need:
                return i + need
        return run

    def remove_skipped_blocks(self, req: Request, num_computed_tokens: int) -> None:
        """Free the blocks that left the window, tail first, stopping at one freed before."""
        table = self._tables.get(req)
        if not table:
            return
        freed: list[list[int]] = []
        for i in range(min(self.num_skipped_blocks(num_computed_tokens), len(table)) - 1, -1, -1):
            slot = table[i]
            if slot is None:
                break
            freed.append(slot)
            table[i] = None
        if freed:
            self.pool.free_blocks(list(chain.from_iterable(freed)))

    def _num_table_blocks(self, req: Request, hits: list[int], num_computed_tokens: int) -> int:
        """The length of `req`'s table once its hit is in (null entries counted)."""
        table = self._tables.get(req)
        if table:
            return len(table)
        return max(self.num_skipped_blocks(num_computed_tokens), len(hits))

    def _hit_slots(self, req: Request, hits: list[int], num_computed_tokens: int) -> list[list[int]]:
        """The cached window blocks a fresh request's hit `hits` takes (those inside its window)."""
        if not hits or self._tables.get(req):
            return []
        start = self.num_skipped_blocks(num_computed_tokens)
        slots = [self._cache.get(h) for h in req.block_hashes[start : len(hits)]]
        assert all(slots), "a hit ends where the window's blocks are cached (`num_hit_blocks`)"
        return slots  # type: ignore[return-value]

    def num_blocks_to_allocate(
        self, req: Request, hits: list[int], num_computed_tokens: int, end: int
    ) -> int:
        num_new = max(0, cdiv(end, self.block_size) - self._num_table_blocks(req, hits, num_computed_tokens))
        hit_blocks = chain.from_iterable(self._hit_slots(req, hits, num_computed_tokens))
        return self.spec.num_groups * num_new + self.pool.num_free_among(hit_blocks)

    def num_blocks_after(self, req: Request, hits: list[int], num_computed_tokens: int, end: int) -> int:
        """To its last token, at most the admission cap (what vLLM's admission gate counts)."""
        held = self._num_table_blocks(req, hits, num_computed_tokens)
        full = max(0, min(cdiv(req.num_tokens, self.block_size), self.admission_cap) - held)
        return self.spec.num_groups * (full - max(0, cdiv(end, self.block_size) - held))

    def allocate_new_computed_blocks(self, req: Request, hits: list[int], num_computed_tokens: int) -> None:
        """A fresh request's table: null entries before its window, then its hit's cached blocks, held;
        for KV that arrives from elsewhere, blocks for the part of it inside the window."""
        if self._tables.get(req):
            return
        slots = self._hit_slots(req, hits, num_computed_tokens)
        self.pool.touch(list(chain.from_iterable(slots)))
        self._tables[req] = [None] * self.num_skipped_blocks(num_computed_tokens) + slots
        self._num_cached[req] = len(hits)

    def allocate_new_blocks(self, req: Request, end: int) -> None:
        table = self._tables.setdefault(req, [])
        num_new = cdiv(end, self.block_size) - len(table)
        if num_new > 0:
            g = self.spec.num_groups
            new = self.pool.take(g * num_new)
            table += [new[i : i + g] for i in range(0, len(new), g)]

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        """Cache the window blocks ending at the prompt's replay boundaries once they are full (vLLM's
        retention 0: no other sliding block can serve a hit)."""
        start = self._num_cached.get(req, 0)
        if not self.enable_prefix_caching or start >= req.num_prompt_tokens // self.block_size:
            return  # (past the last tail: a decode's)
        table = self._tables[req]
        num_full = min(num_tokens // self.block_size, len(table))
        if num_full <= start:
            return
        self._num_cached[req] = num_full
        bs, n = self.block_size, req.num_prompt_tokens
        tails: set[int] = set()
        for boundary in {(n - 1) // bs, n // bs}:
            tails.update(range(max(0, boundary - self.num_hit_blocks_needed), boundary))
        positions = sorted(p for p in tails if start <= p < num_full and table[p] is not None)
        if not positions:
            return
        hashes = self.pool.prefix_index.block_hashes(req, positions[-1] + 1)
        for p in positions:
            slot = table[p]
            assert slot is not None
            if self._cache.put(hashes[p], slot):
                self.pool.ref_cnt.update(dict.fromkeys(slot, 1))

    def free(self, req: Request) -> None:
        """Its blocks, tail first (vLLM's `free`): the uncached to the front, the cached to the LRU end."""
        table = self._tables.pop(req, [])
        self._num_cached.pop(req, None)
        slots = [slot for slot in reversed(table) if slot is not None]
        if slots:
            self.pool.free_blocks(list(chain.from_iterable(slots)))

    def steps_changing(self, computed: list[int]) -> list[int]:
        """The steps whose window leaves a block behind (freed at their allocation)."""
        skipped = list(map(self.num_skipped_blocks, computed))
        return [i for i in range(1, len(computed)) if skipped[i] > skipped[i - 1]]

    def decode_steps_changing(self, num_computed_tokens: int, num_steps: int) -> range:
        """Step i allocates with c = num_computed_tokens + i computed; a block leaves the window when
        c - W + 1 reaches a positive multiple of block_size: every block_size steps from the first."""
        bs, c = self.block_size, num_computed_tokens
        first_x = max(bs, -(-(c - self.window + 2) // bs) * bs)  # c + i - W + 1 at the first such step
        return range(first_x + self.window - 1 - c, num_steps, bs)

    def tables(self, req: Request) -> list[Slot]:
        """`req`'s table (for tests and conformance: its positions, None where a block left the window)."""
        return list(self._tables.get(req, []))
