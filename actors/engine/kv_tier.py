"""One KV offload tier: blocks by chained block hash, evicted least recently used first (vLLM's LRU
offloading manager), each with its copy of the KV and the time its store completes.

A block is a hit only once its store has completed (vLLM: `is_ready`); a block being stored or loaded
is pinned and never evicted. A store that does not fit after evicting every unpinned block is skipped
whole (vLLM's `prepare_store` answering None). Stores and loads each queue on one wire of the tier's
link (a GPU's copies to host run on a stream each way)::

    stores  |== A ==|== B ==|            ready: A at the end of its wire + latency + overhead
    loads       |== C ==|                loads never wait for stores (the other direction)
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from actors.engine.block_hash import BlockHash
from actors.engine.kv_transfer import LinkQueue
from emulation.profiles import LinkProfile
from emulation.transfer import handoff_time
from messages import BlockRemoved, BlockStored


@dataclass
class _Entry:
    ready_s: float
    """When its store completes: a lookup before it misses."""
    kv: np.ndarray | None = field(repr=False)
    """[num_layers, 2, num_kv_heads, block_size, head_dim] of the runner; None with compute skip."""
    num_loads: int = 0
    """Loads under way (pinned while > 0)."""


@dataclass
class TierCounters:
    """What a tier did since it was built (read by the engine's stats and report)."""

    num_stored_blocks: int = 0
    num_skipped_stores: int = 0
    num_loaded_blocks: int = 0
    num_evicted_blocks: int = 0
    store_bytes: int = 0
    load_bytes: int = 0
    store_s: float = 0.0
    """Emulated seconds of stores, from their start to their completion (summed)."""
    load_s: float = 0.0


class KVTier:
    """`medium`: the tier's name in KV events and metrics (`host`, `disk`); `block_bytes`: one block's
    target-model KV over the engine's GPUs, moved on `lanes` copies at once (one a GPU)."""

    def __init__(
        self, medium: str, num_blocks: int, *, link: LinkProfile, block_bytes: int, lanes: int = 1
    ) -> None:
        self.medium = medium
        self.num_blocks = num_blocks
        self.link = link
        self.block_bytes = block_bytes
        self.lanes = lanes
        self._blocks: OrderedDict[BlockHash, _Entry] = OrderedDict()
        """Least recently used first."""
        self._stores = LinkQueue()
        self._loads = LinkQueue()
        self.counters = TierCounters()
        self._events: list[BlockStored | BlockRemoved] | None = None

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def usage(self) -> float:
        return len(self._blocks) / self.num_blocks if self.num_blocks else 0.0

    def publish_kv_events(self) -> None:
        """Record the blocks stored and evicted (for a KV-aware router scoring hits per tier)."""
        self._events = []

    def take_kv_events(self) -> list[BlockStored | BlockRemoved]:
        """The changes since the last call, in order (none while events are off)."""
        if not self._events:
            return []
        events, self._events = self._events, []
        return events

    def num_ready(self, hashes: Sequence[BlockHash], now: float) -> int:
        """Leading `hashes` this tier holds with their store complete by `now`."""
        num = 0
        for h in hashes:
            entry = self._blocks.get(h)
            if entry is None or entry.ready_s > now:
                break
            num += 1
        return num

    def touch(self, hashes: Sequence[BlockHash]) -> None:
        """Make the blocks of `hashes` it holds the most recently used, the first ones last (a prefix is
        evicted after what follows it, as vLLM touches them)."""
        for h in reversed(hashes):
            if h in self._blocks:
                self._blocks.move_to_end(h)

    def store(
        self, hashes: Sequence[BlockHash], kvs: Sequence[np.ndarray | None], now: float
    ) -> tuple[int, float]:
        """Store the blocks of `hashes` (their KV `kvs`) it lacks, evicting unpinned ready blocks least
        recently used first; returns how many were new (0: none, or skipped for want of room) and
        when their store completes. The blocks it held already are touched."""
        self.touch(hashes)
        new = [(h, kv) for h, kv in zip(hashes, kvs, strict=True) if h not in self._blocks]
        if not new:
            return 0, now
        if not self._make_room(len(new), now):
            self.counters.num_skipped_stores += 1
            return 0, now
        t = handoff_time(len(new) * self.block_bytes, len(new), self.link, self.lanes)
        ready_s = self._stores.reserve_now(now, t.wire_s) + t.total_s
        for h, kv in new:
            self._blocks[h] = _Entry(ready_s, kv)
        c = self.counters
        c.num_stored_blocks += len(new)
        c.store_bytes += len(new) * self.block_bytes
        c.store_s += ready_s - now
        if self._events is not None:
            self._events.append(BlockStored([h for h, _ in new], medium=self.medium))
        return len(new), ready_s

    def _make_room(self, num: int, now: float) -> bool:
        """Evict the least recently used unpinned, ready blocks until `num` more fit; False (nothing
        evicted) if they cannot."""
        over = len(self._blocks) + num - self.num_blocks
        if over <= 0:
            return True
        victims = []
        for h, entry in self._blocks.items():
            if entry.num_loads == 0 and entry.ready_s <= now:
                victims.append(h)
                if len(victims) == over:
                    break
        if len(victims) < over:
            return False
        for h in victims:
            del self._blocks[h]
        self.counters.num_evicted_blocks += len(victims)
        if self._events is not None:
            self._events.append(BlockRemoved(victims, medium=self.medium))
        return True

    def load(self, hashes: Sequence[BlockHash], now: float) -> tuple[list[np.ndarray | None], float]:
        """Start loading the (ready) blocks of `hashes` into GPU blocks at `now`: their KV and when the
        load completes; they stay pinned until `loaded`."""
        entries = [self._blocks[h] for h in hashes]
        for entry in entries:
            entry.num_loads += 1
        self.touch(hashes)
        t = handoff_time(len(hashes) * self.block_bytes, len(hashes), self.link, self.lanes)
        done_s = self._loads.reserve_now(now, t.wire_s) + t.total_s
        c = self.counters
        c.num_loaded_blocks += len(hashes)
        c.load_bytes += len(hashes) * self.block_bytes
        c.load_s += done_s - now
        return [entry.kv for entry in entries], done_s

    def loaded(self, hashes: Sequence[BlockHash]) -> None:
        """A load of `hashes` is over (done, or its request ended): unpin them."""
        for h in hashes:
            self._blocks[h].num_loads -= 1

    def assert_consistent(self) -> None:
        """No block pinned by a load (every load ended), and no more blocks than the tier holds."""
        pinned = [h for h, e in self._blocks.items() if e.num_loads]
        assert not pinned, f"{self.medium} tier: {len(pinned)} blocks still pinned by loads"
        assert len(self._blocks) <= self.num_blocks, f"{self.medium} tier over capacity"
