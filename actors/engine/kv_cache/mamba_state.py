"""A hybrid model's SSM states (vLLM's `MambaManager`, one pool of one page size with the attention KV).

Each request holds a running-state block in each Mamba group from its first allocation on
(`MambaStates.block_ids`: the state as of its last computed token, what a P/D handoff ships). With
prefix caching (vLLM's align mode) the state at its prompt's checkpoint is cached (`state_cache.py`),
prompt chunks end on block boundaries (`mamba_align.py`), and a prefix hit reaches only as far as a
cached state does, holding that state's blocks until its first step has read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from actors.engine.kv_cache.block_pool import BlockPool
from actors.engine.kv_cache.mamba_align import block_aligned_split
from actors.engine.kv_cache.manager import KVCacheManager
from actors.engine.kv_cache.state_cache import checkpoint_position
from actors.engine.request import Request


@dataclass(frozen=True)
class MambaStateSpec:
    """The SSM layers of a hybrid model (`ModelProfile.kv_cache_groups`, `SsmGeometry`)."""

    num_groups: int
    """Mamba KV cache groups: a request holds one running-state block in each (at least 1)."""
    exports_prefill_checkpoint: bool
    """The mixer exports the state at one point inside a step (Mamba2), so a chunk need not stop at
    the prompt's checkpoint (`mamba_align.py`)."""
    max_prefill_tokens: int
    """The most tokens a step gives one request (the scheduler's threshold, else its budget): under a
    block, chunks may end inside one (`mamba_align.py`)."""

    def __post_init__(self) -> None:
        if self.num_groups < 1 or self.max_prefill_tokens < 1:
            raise ValueError(f"a Mamba spec needs groups and a budget, got {self}")

    def manager(self, pool: BlockPool, block_size: int, enable_prefix_caching: bool) -> MambaStateManager:
        return MambaStateManager(pool, block_size, enable_prefix_caching, self)


@dataclass
class MambaStates:
    """What one request holds of the SSM states (vLLM's manager keeps its blocks by request id too)."""

    block_ids: list[int] = field(default_factory=list)
    """Its running state, a block in each Mamba group (as of its last computed token)."""
    hold: list[int] = field(default_factory=list)
    """The cached state its prefix hit starts from, held until its first step has read it."""
    checkpoint: tuple[int, list[int]] | None = None
    """Prefix caching: (position, blocks) where the step reaching its prompt's checkpoint saves the
    state there, to be cached (`state_cache.py`)."""


_NONE = MambaStates()
"""A request holding no state (read only)."""


class MambaStateManager(KVCacheManager):
    keeps_hit_without_load = False

    def __init__(self, pool: BlockPool, block_size: int, enable_prefix_caching: bool, spec: MambaStateSpec):
        super().__init__(pool, block_size, enable_prefix_caching)
        self.spec = spec
        self._states = pool.state_cache
        self._held: dict[str, MambaStates] = {}
        """By request id: what each request holds (none: nothing)."""

    def held(self, req: Request) -> MambaStates:
        """What `req` holds of the states (read only)."""
        return self._held.get(req.request_id, _NONE)

    def _hold(self, req: Request) -> MambaStates:
        return self._held.setdefault(req.request_id, MambaStates())

    def state_block(self, req: Request) -> int | None:
        """Its running state's first block (it stands for every group's: the runner keeps the whole
        state), once it has one."""
        block_ids = self.held(req).block_ids
        return block_ids[0] if block_ids else None

    def runner_fields(self, req: Request, num_new_tokens: int) -> dict[str, Any]:
        """Its running state saved to `state_block`, read from the hit's cached state it holds, else
        from its own block (a received handoff's); its prompt's checkpoint, when this step reaches it."""
        states = self.held(req)
        if not states.block_ids:
            return {}
        own = states.block_ids[0]
        checkpoint = None
        if states.checkpoint is not None and states.checkpoint[0] <= req.num_computed_tokens + num_new_tokens:
            checkpoint = (states.checkpoint[0], states.checkpoint[1][0])
        source = states.hold[0] if states.hold else own
        return {"state_block": own, "state_source_block": source, "state_checkpoint": checkpoint}

    def num_hit_blocks(self, req: Request, hits: list[int]) -> int:
        """A hit ends where a state is cached (vLLM: the Mamba hit within the attention hit), but for a
        request whose state comes from a prefill engine (`_state_comes_with_kv`)."""
        if not hits or self._state_comes_with_kv(req, len(hits)):
            return len(hits)
        return self._states.longest_hit(req.block_hashes, len(hits))

    def _state_comes_with_kv(self, req: Request, num_hit_blocks: int) -> bool:
        """Whether a request's state will arrive from a prefill engine: it awaits remote KV beyond its
        hit of `num_hit_blocks` (vLLM's NIXL connector moves the state unconditionally; a hit that
        leaves nothing to load falls back to a hit on its own cached state, as vLLM's does)."""
        waiting = req.is_remote_prefill and not req.remote_kv_loaded
        return waiting and num_hit_blocks * self.block_size < req.remote_kv_end

    def _state_hit(self, req: Request, hits: list[int]) -> list[int]:
        """The blocks of the state cached where the prefix hit `hits` ends (none without a hit)."""
        if not hits or self._state_comes_with_kv(req, len(hits)):
            return []
        return list(self._states.get(req.block_hashes[len(hits) - 1]) or ())

    def _checkpoint_in(self, req: Request, end: int) -> int | None:
        """The prompt's checkpoint with prefix caching, if a step computing up to `end` reaches it first
        and no state is cached there yet (None otherwise)."""
        if not self.enable_prefix_caching or self.held(req).checkpoint is not None:
            return None
        if req.is_remote_prefill and not req.remote_kv_loaded:  # it loads its prompt, never computes it
            return None
        at = checkpoint_position(req.num_prompt_tokens, self.block_size)
        if not at or not req.num_computed_tokens < at <= end:
            return None
        num = at // self.block_size
        hashes = self.pool.prefix_index.block_hashes(req, num)
        return at if self._states.get(hashes[num - 1]) is None else None

    def num_blocks_to_allocate(
        self, req: Request, hits: list[int], num_computed_tokens: int, end: int
    ) -> int:
        """Its running states at its first allocation, its checkpoint's when this step reaches it, and a
        hit state nobody holds."""
        g = self.spec.num_groups
        num_states = g * (not self.held(req).block_ids) + g * (self._checkpoint_in(req, end) is not None)
        return num_states + self.pool.num_free_among(self._state_hit(req, hits))

    def allocate_new_computed_blocks(self, req: Request, hits: list[int], num_computed_tokens: int) -> None:
        if hits:
            states = self._hold(req)
            states.hold = self._state_hit(req, hits)
            self.pool.touch(states.hold)

    def allocate_new_blocks(self, req: Request, end: int) -> None:
        """Its running states, then its checkpoint's. The checkpoint is read before any block is taken
        (a take may evict the state cached there): the coordinator asks this manager first."""
        checkpoint = self._checkpoint_in(req, end)
        states = self._hold(req)
        if not states.block_ids:
            states.block_ids = self.pool.take(self.spec.num_groups)
        if checkpoint is not None:
            states.checkpoint = (checkpoint, self.pool.take(self.spec.num_groups))

    def on_step_done(self, requests: list[Request]) -> None:
        """The hit state each request read is released, and the state at its checkpoint, once computed,
        is cached (its blocks free and findable, as vLLM frees them)."""
        for req in requests:
            states = self._held.get(req.request_id)
            if states is None:  # (it holds no state yet)
                continue
            if states.hold:
                self.pool.release(states.hold)
                states.hold = []
            if states.checkpoint is not None and req.num_computed_tokens >= states.checkpoint[0]:
                at, ids = states.checkpoint
                states.checkpoint = None
                num = at // self.block_size
                if self._states.put(self.pool.prefix_index.block_hashes(req, num)[num - 1], ids):
                    self.pool.free_queue.push(ids)
                else:  # another request cached this boundary first
                    self.pool.free_queue.push_front(ids)

    def free(self, req: Request) -> None:
        """Its running states and a checkpoint not reached (never cached: reused first); a hit state it
        still holds is released."""
        states = self._held.pop(req.request_id, _NONE)
        checkpoint = states.checkpoint[1] if states.checkpoint else []
        self.pool.free_blocks(states.block_ids + checkpoint + states.hold)

    def assert_empty(self) -> None:
        assert not self._held, f"SSM states held: {list(self._held)[:10]}"

    def align_chunk(self, req: Request, num_new_tokens: int) -> int:
        """With prefix caching, chunks end on block boundaries and at the checkpoint (`mamba_align.py`)."""
        if not self.enable_prefix_caching:
            return num_new_tokens
        return block_aligned_split(
            req,
            num_new_tokens,
            block_size=self.block_size,
            max_prefill_tokens=self.spec.max_prefill_tokens,
            internal_checkpoint=self.spec.exports_prefill_checkpoint,
        )

    def steady(self, requests: list[Request], chunked: bool) -> bool:
        """Not while a chunk would stop at a block boundary, a hit state is held or a checkpoint is due."""
        if chunked and self.enable_prefix_caching:
            return False
        return not any(s.hold or s.checkpoint for s in map(self.held, requests))
