"""One kind of KV cache under the coordinator (vLLM's `SingleTypeKVCacheManager`): its blocks of a
request, the rule by which a prefix hit holds for it, and when it frees them.

The coordinator asks every manager, in order, and never branches on the model's kind::

    allocate_slots:  remove_skipped_blocks   (each frees what the step no longer reads, fit or not)
                     num_blocks_to_allocate  (each; the sum must fit the free blocks)
                     allocate_new_computed_blocks  (each holds its part of the prefix hit)
                     allocate_new_blocks     (each takes its new blocks)
                     cache_blocks            (each enters what a later prompt can hit)
    after a step:    on_step_done            free:  free (in the reverse order)

`num_computed_tokens`: the tokens whose KV is in place before the step (computed, hit, or arriving
from elsewhere); `end`: the tokens that need a slot once the step has run.

A request's full-attention blocks are its `block_ids` (every model has full-attention layers:
`full_attention.py`, the coordinator's first kind); the others keep what they hold beside them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

from actors.engine.kv_cache.block_pool import BlockPool
from actors.engine.request import Request


class KVCacheManager(ABC):
    num_blocks_per_position: int = 0
    """Blocks it takes for each block of new tokens (the window of steps' count of blocks needed)."""
    keeps_hit_without_load: bool = True
    """Whether a request whose remote KV failed to load still starts from its local prefix hit (a
    hybrid's hit then had no state of its own: it computes from the start)."""

    def __init__(self, pool: BlockPool, block_size: int, enable_prefix_caching: bool) -> None:
        self.pool = pool
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching

    def num_hit_blocks(self, req: Request, hits: list[int]) -> int:
        """Of the full-attention prefix hit `hits`, the leading blocks this kind's cache also holds."""
        return len(hits)

    def remove_skipped_blocks(self, req: Request, num_computed_tokens: int) -> None:
        """Free the blocks no step of `req` reads any more: none by default."""
        return

    @abstractmethod
    def num_blocks_to_allocate(
        self, req: Request, hits: list[int], num_computed_tokens: int, end: int
    ) -> int:
        """Blocks `req` takes from the free ones to hold its first `end` tokens, given the prefix hit
        `hits` (a cached block nobody holds counts: it leaves the free queue). It may be negative where
        `req` holds more than it needs."""

    def num_blocks_after(self, req: Request, hits: list[int], num_computed_tokens: int, end: int) -> int:
        """Blocks `req` will need past those for its first `end` tokens to reach its last token (the
        admission gate that the whole sequence fits)."""
        return 0

    def allocate_new_computed_blocks(self, req: Request, hits: list[int], num_computed_tokens: int) -> None:
        """Hold this kind's part of the prefix hit `hits` (before any manager takes a block): none by
        default, its hits being full attention's."""
        return

    @abstractmethod
    def allocate_new_blocks(self, req: Request, end: int) -> None:
        """Take the blocks `num_blocks_to_allocate` counted."""

    def cache_blocks(self, req: Request, num_tokens: int) -> None:
        """Enter the blocks among `req`'s first `num_tokens` tokens that a later prompt can hit: none by
        default."""
        return

    def on_step_done(self, requests: list[Request]) -> None:
        """`requests` computed a step: nothing changes by default."""
        return

    @abstractmethod
    def free(self, req: Request) -> None:
        """Drop `req`'s hold on this kind's blocks."""

    def align_chunk(self, req: Request, num_new_tokens: int) -> int:
        """Of `num_new_tokens` the budget gives `req` this step, those this kind lets it compute."""
        return num_new_tokens

    def state_block(self, req: Request) -> int | None:
        """The block of `req`'s running recurrent state as of its last computed token (what a P/D
        handoff moves beside its KV), for a kind that keeps one; None otherwise."""
        return None

    def runner_fields(self, req: Request, num_new_tokens: int) -> dict[str, Any]:
        """What the runner needs of this kind for `req`'s step of `num_new_tokens` beyond its
        full-attention blocks (`RunnerInput`'s fields): none by default."""
        return {}

    def assert_empty(self) -> None:
        """No request holds anything of this kind (its blocks are the pool's to check)."""
        return

    def steps_changing(self, computed: list[int]) -> list[int]:
        """Of steps allocating with `computed` tokens each (one a step, in order), those at which this
        kind changes a request's blocks beyond taking new ones (what a window of steps replays)."""
        return []

    def decode_steps_changing(self, num_computed_tokens: int, num_steps: int) -> range:
        """`steps_changing` for a decode's steps 1 .. num_steps - 1 after one with `num_computed_tokens`."""
        return range(0)

    def steady(self, requests: list[Request], chunked: bool) -> bool:
        """Whether `requests`' blocks change over the next steps only by new blocks for new tokens, the
        last one computing prompt chunks where `chunked` (what a window of steps assumes)."""
        return True


class KVCacheSpec(Protocol):
    """A kind of KV cache beside full attention, as the composition root reads it from the model."""

    def manager(self, pool: BlockPool, block_size: int, enable_prefix_caching: bool) -> KVCacheManager: ...
