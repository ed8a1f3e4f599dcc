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

from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from typing import Protocol

import numpy as np

from actors.engine.kv_cache.block_hash import BlockHash
from actors.engine.kv_connectors.transfer import LinkQueue
from emulation.profiles import LinkProfile
from emulation.transfer import handoff_time
from messages import BlockRemoved, BlockStored


class Tier(Protocol):
    """An engine's offload tier as its offloading connector drives it: one of its own (`KVTier`: host
    memory, disk) or its side of the deployment's shared store (`SharedKVTier`)."""

    medium: str
    """Its name in KV events and metrics (`host`, `disk`, `shared`)."""
    block_bytes: int
    fetches_later: bool
    """A load's KV comes after it, from `fetch` (the shared store's, over the network)."""

    def refresh(self) -> None:
        """A request arrived: what it holds is brought up to date before a lookup."""

    def touch(self, hashes: Sequence[BlockHash]) -> None:
        """A prompt looked up these blocks: those it holds are recently used."""

    def num_ready(self, hashes: Sequence[BlockHash], now: float) -> int:
        """Leading `hashes` it holds, their stores complete by `now`."""
        ...

    def load(self, hashes: Sequence[BlockHash], now: float) -> tuple[list[np.ndarray | None], float]:
        """Start loading `hashes` at `now`: their KV (placeholders where `fetches_later`) and when the
        load completes; they stay pinned until `loaded`."""
        ...

    async def fetch(self, hashes: Sequence[BlockHash]) -> list[np.ndarray | None]:
        """The KV of the leading `hashes` it still holds."""
        ...

    def loaded(self, hashes: Sequence[BlockHash]) -> None:
        """A load of `hashes` is over: unpin them."""

    def store(
        self, hashes: Sequence[BlockHash], kvs: Sequence[np.ndarray | None], now: float
    ) -> tuple[int, float]:
        """Store the blocks of `hashes` it lacks from `now` on: how many, and when they are ready."""
        ...

    def report(self, record: Callable[[str, float, int, int], None]) -> None:
        """Its occupancy, evictions and skipped stores since its last report, to `record`."""

    def publish_kv_events(self) -> None: ...

    def take_kv_events(self) -> list[BlockStored | BlockRemoved]: ...

    def assert_consistent(self) -> None: ...


class TierPath:
    """A tier's link as its transfers queue on it: one wire for stores, one for loads. `block_bytes`:
    one block's target-model KV over the engine's GPUs, moved on `lanes` copies at once (one a GPU)."""

    def __init__(self, link: LinkProfile, block_bytes: int, lanes: int) -> None:
        self.link = link
        self.block_bytes = block_bytes
        self.lanes = lanes
        self._stores = LinkQueue()
        self._loads = LinkQueue()

    def store_done_s(self, num_blocks: int, now: float) -> float:
        """When a store of `num_blocks` sent from `now` on completes (after the stores queued before)."""
        return self._done_s(self._stores, num_blocks, now)

    def load_done_s(self, num_blocks: int, now: float) -> float:
        return self._done_s(self._loads, num_blocks, now)

    def _done_s(self, wire: LinkQueue, num_blocks: int, now: float) -> float:
        t = handoff_time(num_blocks * self.block_bytes, num_blocks, self.link, self.lanes)
        return wire.reserve_now(now, t.wire_s) + t.total_s


def num_ready(ready_s: Mapping[BlockHash, float], hashes: Sequence[BlockHash], now: float) -> int:
    """Leading `hashes` of `ready_s` (a block's hash -> when its store completes) stored by `now`."""
    num = 0
    for h in hashes:
        t = ready_s.get(h)
        if t is None or t > now:
            break
        num += 1
    return num


class KVTier:
    """`medium`: the tier's name in KV events and metrics (`host`, `disk`); `path`: its link."""

    fetches_later = False

    def __init__(self, medium: str, num_blocks: int, path: TierPath) -> None:
        self.medium = medium
        self.num_blocks = num_blocks
        self.path = path
        self.block_bytes = path.block_bytes
        self._ready_s: OrderedDict[BlockHash, float] = OrderedDict()
        """The blocks it holds, least recently used first, with when each one's store completes (a
        lookup before then misses). Flat values, not an object a block: a store enters hundreds."""
        self._kv: dict[BlockHash, np.ndarray] = {}
        """Their KV, [num_layers, 2, num_kv_heads, block_size, head_dim] of the runner (none with
        compute skip)."""
        self._pins: dict[BlockHash, int] = {}
        """Blocks being loaded -> loads under way (never evicted meanwhile)."""
        self.num_evicted_blocks = 0
        """Blocks evicted since its connector last reported them (and reset this)."""
        self.num_skipped_stores = 0
        """Stores skipped whole since then: every block it could evict was being loaded or stored."""
        self._events: list[BlockStored | BlockRemoved] | None = None

    def __len__(self) -> int:
        return len(self._ready_s)

    @property
    def usage(self) -> float:
        return len(self._ready_s) / self.num_blocks if self.num_blocks else 0.0

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
        return num_ready(self._ready_s, hashes, now)

    def touch(self, hashes: Sequence[BlockHash]) -> None:
        """Make the blocks of `hashes` it holds the most recently used, the first ones last (a prefix is
        evicted after what follows it, as vLLM touches them)."""
        deque(map(self._ready_s.move_to_end, filter(self._ready_s.__contains__, reversed(hashes))), 0)

    def store(
        self, hashes: Sequence[BlockHash], kvs: Sequence[np.ndarray | None], now: float
    ) -> tuple[int, float]:
        """Store the blocks of `hashes` (their KV `kvs`) it lacks, evicting unpinned ready blocks least
        recently used first; returns how many were new (0: none, or skipped for want of room) and
        when their store completes. The blocks it held already are touched."""
        self.touch(hashes)
        held = self._ready_s
        new = [i for i, h in enumerate(hashes) if h not in held]
        if not new:
            return 0, now
        if not self._make_room(len(new), now):
            self.num_skipped_stores += 1
            return 0, now
        ready_s = self.path.store_done_s(len(new), now)
        new_hashes = [hashes[i] for i in new]
        held.update(zip(new_hashes, repeat(ready_s)))
        self._kv.update((hashes[i], kv) for i in new if (kv := kvs[i]) is not None)
        if self._events is not None:
            self._events.append(BlockStored(new_hashes, medium=self.medium))
        return len(new), ready_s

    def _make_room(self, num: int, now: float) -> bool:
        """Evict the least recently used unpinned, ready blocks until `num` more fit; False (nothing
        evicted) if they cannot."""
        over = len(self._ready_s) + num - self.num_blocks
        if over <= 0:
            return True
        victims = []
        for h, ready_s in self._ready_s.items():
            if ready_s <= now and h not in self._pins:
                victims.append(h)
                if len(victims) == over:
                    break
        if len(victims) < over:
            return False
        deque(map(self._ready_s.__delitem__, victims), 0)
        if self._kv:
            deque((self._kv.pop(h, None) for h in victims), 0)
        self.num_evicted_blocks += len(victims)
        if self._events is not None:
            self._events.append(BlockRemoved(victims, medium=self.medium))
        return True

    def load(self, hashes: Sequence[BlockHash], now: float) -> tuple[list[np.ndarray | None], float]:
        """Start loading the (ready) blocks of `hashes` into GPU blocks at `now`: their KV and when the
        load completes; they stay pinned until `loaded`."""
        pins = self._pins
        for h in hashes:
            pins[h] = pins.get(h, 0) + 1
        self.touch(hashes)
        return list(map(self._kv.get, hashes)), self.path.load_done_s(len(hashes), now)

    async def fetch(self, hashes: Sequence[BlockHash]) -> list[np.ndarray | None]:
        """Their KV, as `load` gave it (its blocks are pinned meanwhile: none goes missing)."""
        return list(map(self._kv.get, hashes))

    def refresh(self) -> None:
        """Nothing to bring up to date: it is this engine's own."""

    def report(self, record: Callable[[str, float, int, int], None]) -> None:
        record(self.medium, self.usage, self.num_evicted_blocks, self.num_skipped_stores)
        self.num_evicted_blocks = self.num_skipped_stores = 0

    def loaded(self, hashes: Sequence[BlockHash]) -> None:
        """A load of `hashes` is over (done, or its request ended): unpin them."""
        pins = self._pins
        for h in hashes:
            if pins[h] == 1:
                del pins[h]
            else:
                pins[h] -= 1

    def assert_consistent(self) -> None:
        """No block pinned by a load (every load ended), and no more blocks than the tier holds."""
        assert not self._pins, f"{self.medium} tier: {len(self._pins)} blocks still pinned by loads"
        assert len(self._ready_s) <= self.num_blocks, f"{self.medium} tier over capacity"
        assert self._kv.keys() <= self._ready_s.keys(), f"{self.medium} tier: KV of evicted blocks kept"
