"""An engine's KV offloading connector (vLLM's `OffloadingConnector`, LMCache's tiers): stores computed
blocks into the engine's offload tiers (`tier.py`: host memory, disk; `shared_tier.py`: the shared
store) and loads a prompt's blocks back from them.

    admission   GPU prefix hit ─┬─ lookup: the blocks after it that a tier holds, consecutive, each
                                │  from the first tier that has it ready (host, then disk)
                                └─ none: computed as usual
                hit ─ blocks allocated for hit + loaded ─ WAITING_FOR_REMOTE_KVS ─ start_load
    a step boundary at or after the load's end ─ get_finished ─ the request computes the rest
    the request ends ─ store: its full computed blocks (the prompt's, with `prompt_only`), deduplicated
                      per tier, in the background on each tier's link

As in vLLM, a lookup always leaves the prompt's last token to compute (its logits give the first
output token), a block being stored is a miss, and a load cannot fail (the blocks stay pinned).
Stores go when a request ends, not block by block as vLLM's do: until then its blocks are in the GPU
prefix cache, which every lookup tries first, and a running request's blocks are never evicted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from actors.engine.background import Background
from actors.engine.kv_cache.coordinator import KVCacheCoordinator
from actors.engine.kv_connectors.base import KVConnector
from actors.engine.kv_connectors.tier import Tier
from actors.engine.request import Request
from actors.engine.runner.executor import Executor
from actors.engine.scheduling.scheduled_batch import ScheduledBatch
from actors.engine.stats import EngineStats
from messages import BlockRemoved, BlockStored, FinishedReason, KVTransferParams, OffloadLoad, OffloadStore


@dataclass(frozen=True)
class _Segment:
    """Consecutive blocks of a prompt that one tier supplies."""

    tier: Tier
    first_block: int
    num_blocks: int

    @property
    def end(self) -> int:
        return self.first_block + self.num_blocks


@dataclass
class _Load:
    req: Request
    segments: list[_Segment]
    start_s: float
    done_s: float = 0.0
    fetched: bool = True
    """Its KV is in the request's blocks (a shared store's comes in the background)."""


class OffloadingConnector(KVConnector):
    """`tiers`: the engine's offload tiers in lookup order (a block comes from the first one holding
    it); `prompt_only`: store a request's prompt blocks only (vLLM's `offload_prompt_only`)."""

    def __init__(
        self,
        tiers: Sequence[Tier],
        *,
        blocks: KVCacheCoordinator,
        executor: Executor,
        stats: EngineStats,
        wake: Callable[[], None],
        prompt_only: bool = True,
    ) -> None:
        """`blocks`: the engine's KV cache; `wake`: wakes its step loop (a fetch from the shared store
        came in)."""
        self.tiers = tiers
        self.wake = wake
        self._fetches = Background()
        self.stats = stats
        self.blocks = blocks
        self.executor = executor
        self.prompt_only = prompt_only
        self._found: dict[str, list[_Segment]] = {}
        """Requests whose lookup hit, until their load starts."""
        self._loading: dict[str, _Load] = {}
        """Requests whose load started, until a step notices it (or they end)."""

    def on_added(self, req: Request) -> None:
        """A request arrived: the engine's view of the shared store is brought up to date."""
        for tier in self.tiers:
            tier.refresh()

    def publish_kv_events(self) -> None:
        for tier in self.tiers:
            tier.publish_kv_events()

    def take_kv_events(self) -> list[BlockStored | BlockRemoved]:
        return [event for tier in self.tiers for event in tier.take_kv_events()]

    # ---- loads -------------------------------------------------------------------------------------

    def lookup(self, req: Request, num_hit_blocks: int, now: float) -> int:
        """Blocks after `req`'s GPU prefix hit of `num_hit_blocks` that the tiers hold ready at `now`,
        consecutive (its load is planned: `start_load`); every tier touches what it holds of the
        prompt."""
        bs = self.blocks.block_size
        limit = (req.num_prompt_tokens - 1) // bs  # the last token is computed here
        hashes = self.blocks.block_hashes(req, limit)
        for tier in self.tiers:
            tier.touch(hashes)
        segments, at = [], num_hit_blocks
        while at < limit:
            for tier in self.tiers:
                if n := tier.num_ready(hashes[at:limit], now):
                    segments.append(_Segment(tier, at, n))
                    at += n
                    break
            else:
                break
        if segments:
            self._found[req.request_id] = segments
        return at - num_hit_blocks

    def start_loads(self, batch: ScheduledBatch, now: float) -> None:
        """The batch's requests whose lookup hit got their blocks: their loads start."""
        for req in batch.new_offload_loads:
            self.start_load(req, now)

    def start_load(self, req: Request, now: float) -> None:
        """`req` got its blocks at `now`: its tiers copy their blocks in (the real KV moves now, or once
        the shared store sent it; the request sees them at the first step boundary at or after the
        emulated end)."""
        load = _Load(req, self._found.pop(req.request_id), now, now)
        self._loading[req.request_id] = load
        kvs: list[np.ndarray | None] = []
        for seg in load.segments:
            part, done_s = seg.tier.load(req.block_hashes[seg.first_block : seg.end], now)
            kvs += part
            load.done_s = max(load.done_s, done_s)
        self._record(load)
        if any(seg.tier.fetches_later for seg in load.segments):
            load.fetched = False
            self._fetches.run(self._fetch(load, kvs))
        else:
            self._write(load, kvs)

    async def _fetch(self, load: _Load, kvs: list[np.ndarray | None]) -> None:
        """Bring the shared store's blocks of `load` in; if it evicted some since the lookup (or cannot
        be reached), the load ends before the first one missing (the request computes from there)."""
        first = load.segments[0].first_block
        for i, seg in enumerate(load.segments):
            if not seg.tier.fetches_later:  # (its KV came with the load)
                continue
            try:
                got = await seg.tier.fetch(load.req.block_hashes[seg.first_block : seg.end])
            except Exception:  # the store's actor died: nothing of it comes
                got = []
            if load.req.request_id not in self._loading:  # it ended meanwhile (its blocks unpinned)
                return
            kvs[seg.first_block - first : seg.first_block - first + len(got)] = got
            if len(got) < seg.num_blocks:
                self._unpin(_Load(load.req, load.segments[i + 1 :], load.start_s))
                load.segments[i:] = [_Segment(seg.tier, seg.first_block, len(got))] if got else []
                del kvs[seg.first_block - first + len(got) :]
                self._record(load)
                break
        self._write(load, kvs)
        load.fetched = True
        self.wake()

    def _record(self, load: _Load) -> None:
        """`load` on its request: the tokens it brings and, on its first admission (a preempted request
        loading again keeps its first's), by tier, with the load's times and bytes."""
        req, t, bs = load.req, load.req.times, self.blocks.block_size
        req.num_offload_tokens = sum(seg.num_blocks for seg in load.segments) * bs
        if t.first_scheduled_s is not None:
            return
        num_tokens = {f"num_{seg.tier.medium}_tokens": seg.num_blocks * bs for seg in load.segments}
        t.offload_load = OffloadLoad(
            **num_tokens,
            offload_load_start_s=load.start_s,
            offload_load_done_s=load.done_s,
            offload_load_bytes=sum(seg.num_blocks * seg.tier.block_bytes for seg in load.segments),
        )

    def _write(self, load: _Load, kvs: list[np.ndarray | None]) -> None:
        """Real compute: the loaded KV into the request's blocks after its GPU hit."""
        if self.executor.runner is None or not kvs:
            return
        first = load.segments[0].first_block
        ids = load.req.block_ids[first : first + len(kvs)]
        self.executor.write_kv(ids, np.concatenate(kvs, axis=3))  # type: ignore[arg-type]

    def get_finished(self, now: float) -> list[Request]:
        """Step boundary: requests whose loads are done by `now` (their blocks unpinned, each tier's
        part recorded)."""
        done = [load for load in self._loading.values() if load.fetched and load.done_s <= now + 1e-12]
        for load in done:
            del self._loading[load.req.request_id]
            self._unpin(load)
            for seg in load.segments:
                num_bytes = seg.num_blocks * seg.tier.block_bytes
                self.stats.on_kv_offload("load", seg.tier.medium, num_bytes, load.done_s - load.start_s)
        return [load.req for load in done]

    def upcoming(self, since: float) -> list[float]:
        """Loads ending after `since` (or at it: noticed only once the loop runs again); one whose KV
        the shared store has not sent yet wakes the engine when it comes (`wake`)."""
        return [load.done_s for load in self._loading.values() if load.fetched and load.done_s >= since]

    def request_finished(self, req: Request, reason: FinishedReason, now: float) -> KVTransferParams | None:
        """`req` ended: a load it had planned or started is dropped (its blocks unpinned), and its
        computed blocks are stored (before the scheduler frees them); nothing is handed on."""
        self._found.pop(req.request_id, None)
        load = self._loading.pop(req.request_id, None)
        if load is not None:
            self._unpin(load)
        self.store(req, now)
        return None

    @staticmethod
    def _unpin(load: _Load) -> None:
        for seg in load.segments:
            seg.tier.loaded(load.req.block_hashes[seg.first_block : seg.end])

    # ---- stores ------------------------------------------------------------------------------------

    def store(self, req: Request, now: float) -> None:
        """Store `req`'s full computed blocks (its prompt's, with `prompt_only`) in every tier that
        lacks them, from `now` on."""
        bs = self.blocks.block_size
        num_full = min(req.num_computed_tokens, len(req.block_ids) * bs) // bs
        if self.prompt_only:
            num_full = min(num_full, req.num_prompt_tokens // bs)
        if num_full == 0:
            return
        hashes = self.blocks.block_hashes(req, num_full)
        kvs = self._read(req, num_full)
        stored = req.times.offload_store
        total_bytes, done_s = stored.offload_store_bytes, stored.offload_store_done_s
        for tier in self.tiers:
            num_stored, ready_s = tier.store(hashes, kvs, now)
            if num_stored:
                num_bytes = num_stored * tier.block_bytes
                total_bytes += num_bytes
                done_s = max(done_s or ready_s, ready_s)
                self.stats.on_kv_offload("store", tier.medium, num_bytes, ready_s - now)
            tier.report(self.stats.on_kv_offload_tier)
        req.times.offload_store = OffloadStore(total_bytes, done_s)

    def _read(self, req: Request, num_blocks: int) -> list[np.ndarray | None]:
        """The runner's KV of `req`'s first `num_blocks` blocks, a copy each (None each: compute skip)."""
        kv = self.executor.read_kv(req.block_ids[:num_blocks], num_blocks * self.blocks.block_size)
        if kv is None:
            return [None] * num_blocks
        return list(np.split(kv.copy(), num_blocks, axis=3))

    def assert_empty(self) -> None:
        """No load left planned or under way, and no tier with a block still pinned."""
        assert not self._found, f"offload loads planned, never started: {list(self._found)[:10]}"
        assert not self._loading, f"offload loads never noticed: {list(self._loading)[:10]}"
        for tier in self.tiers:
            tier.assert_consistent()
