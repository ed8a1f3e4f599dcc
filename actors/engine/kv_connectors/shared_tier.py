"""An engine's side of the deployment's shared KV store (`actors/kv_store.py`): a tier of its
offloading connector whose blocks live in the store, every engine's alike.

Lookups read the engine's view of the store (hash -> when its store completes), which each of its
calls to the store brings up to date; a load's KV comes from the store in the background, and what the
store evicted meanwhile is missing from it. Its transfers queue on the engine's own link to the store,
one wire for loads and one for stores, as a host tier's do on PCIe (`kv_tier.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from actors.engine.background import Background
from actors.engine.kv_cache.block_hash import BlockHash
from actors.engine.kv_connectors.tier import TierPath, num_ready
from messages import BlockRemoved, BlockStored, KVStoreChanges


class KVStoreClient(Protocol):
    """The shared store as an engine calls it (the store itself, or a client of its actor)."""

    async def put(
        self, engine_id: str, hashes: Sequence[BlockHash], kvs: Sequence[np.ndarray | None], ready_s: float
    ) -> KVStoreChanges: ...

    async def get(
        self, engine_id: str, hashes: Sequence[BlockHash]
    ) -> tuple[list[np.ndarray | None], KVStoreChanges]: ...

    async def changes(self, engine_id: str) -> KVStoreChanges: ...


class SharedKVTier:
    """The engine `engine_id`'s tier over the store `kv_store` (its capacity is the store's)."""

    medium = "shared"
    fetches_later = True

    def __init__(self, engine_id: str, store: KVStoreClient, path: TierPath) -> None:
        self.engine_id = engine_id
        self.kv_store = store
        self.path = path
        self.block_bytes = path.block_bytes
        self._calls = Background()
        """Its puts and view refreshes under way."""
        self._view: dict[BlockHash, float] = {}
        """What the store holds as this engine last heard, with when each block's store completes."""

    def publish_kv_events(self) -> None:
        """Nothing to publish: every engine reads the same store, so it tells a router nothing."""

    def take_kv_events(self) -> list[BlockStored | BlockRemoved]:
        return []

    def num_ready(self, hashes: Sequence[BlockHash], now: float) -> int:
        """Leading `hashes` the store holds, as this engine last heard, with their store complete."""
        return num_ready(self._view, hashes, now)

    def touch(self, hashes: Sequence[BlockHash]) -> None:
        """Nothing: the store's recency counts its puts and gets."""

    def store(
        self, hashes: Sequence[BlockHash], kvs: Sequence[np.ndarray | None], now: float
    ) -> tuple[int, float]:
        """Send the blocks the store lacks (as this engine knows it) over the link; they count as held
        at once, the store's answer corrects the view."""
        new = [(h, kv) for h, kv in zip(hashes, kvs, strict=True) if h not in self._view]
        if not new:
            return 0, now
        ready_s = self.path.store_done_s(len(new), now)
        self._view.update(dict.fromkeys((h for h, _ in new), ready_s))
        self._calls.run(self._put([h for h, _ in new], [kv for _, kv in new], ready_s))
        return len(new), ready_s

    async def _put(self, hashes: list[BlockHash], kvs: list[np.ndarray | None], ready_s: float) -> None:
        self._apply(await self.kv_store.put(self.engine_id, hashes, kvs, ready_s))

    def load(self, hashes: Sequence[BlockHash], now: float) -> tuple[list[np.ndarray | None], float]:
        """When a load of `hashes` starting at `now` completes; their KV comes from `fetch`."""
        return [None] * len(hashes), self.path.load_done_s(len(hashes), now)

    async def fetch(self, hashes: Sequence[BlockHash]) -> list[np.ndarray | None]:
        """The KV of the leading `hashes` the store still holds (fewer: it evicted the next one)."""
        kvs, changes = await self.kv_store.get(self.engine_id, hashes)
        self._apply(changes)
        return kvs

    def refresh(self) -> None:
        """Bring the view up to date (in the background: a request arriving starts it before the
        engine looks it up)."""
        self._calls.run(self._refresh())

    async def _refresh(self) -> None:
        self._apply(await self.kv_store.changes(self.engine_id))

    def loaded(self, hashes: Sequence[BlockHash]) -> None:
        """Nothing pinned: a fetch copies the blocks out of the store."""

    def report(self, record: Callable[[str, float, int, int], None]) -> None:
        """Nothing: the store's occupancy is the store's own (`actors/kv_store.py`)."""

    def _apply(self, changes: KVStoreChanges) -> None:
        for h, ready_s in changes.entries:
            if ready_s is None:
                self._view.pop(h, None)
            else:
                self._view[h] = ready_s

    def assert_consistent(self) -> None:
        """Nothing held here but the view."""
