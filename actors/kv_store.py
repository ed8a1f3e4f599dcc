"""The deployment's shared KV store (Mooncake's store, LMCache's remote backend): every engine stores
its computed prompt blocks here and loads them back, whichever engine computed them.

The store holds the blocks (their KV, by chained block hash, least recently used evicted first) and a
log of what it gained and lost. An engine does not ask it at each lookup: it keeps a view, brought up
to date by the changes each of its calls returns (`KVStoreChanges`), and by a call as each request
arrives; so a lookup may miss a block another engine stored a moment ago, or count one the store
evicted since (the load then finds it gone and the request computes it: `OffloadingConnector`). Transfer
times are the engines' own (each over its link to the store).

    engine A ── put(blocks, ready_s) ──▶ store ◀── get(hashes) ── engine B
             ◀─ changes since A's cursor ─┘  └─ blocks (the leading ones it holds), changes ─▶
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from actors.engine.kv_cache.block_hash import BlockHash
from messages import KVStoreChanges


class KVStore:
    """`num_blocks`: its capacity in blocks of the target's KV (a block over an engine's GPUs)."""

    def __init__(self, num_blocks: int, engine_ids: Sequence[str]) -> None:
        """`engine_ids`: the engines that call it (the log is kept until each has read it: one that
        stops calling, as a killed engine, keeps it growing for the rest of the run)."""
        self.num_blocks = num_blocks
        self._blocks: OrderedDict[BlockHash, np.ndarray | None] = OrderedDict()
        """hash -> its KV, least recently used first (when its store completes is in the log)."""
        self._log: list[tuple[BlockHash, float | None]] = []
        """(hash, ready_s) stored, (hash, None) evicted, in order; `_log_start` entries dropped before."""
        self._log_start = 0
        self._cursors = dict.fromkeys(engine_ids, 0)
        """engine id -> how far it has read the log."""

    async def put(
        self, engine_id: str, hashes: Sequence[BlockHash], kvs: Sequence[np.ndarray | None], ready_s: float
    ) -> KVStoreChanges:
        """Store the blocks it lacks (those it holds are touched), evicting the least recently used;
        the changes since `engine_id`'s last call."""
        for h, kv in zip(hashes, kvs, strict=True):
            if h in self._blocks:
                self._blocks.move_to_end(h)
                continue
            if len(self._blocks) == self.num_blocks:
                old, _ = self._blocks.popitem(last=False)
                self._log.append((old, None))
            self._blocks[h] = kv
            self._log.append((h, ready_s))
        return self._changes(engine_id)

    async def get(
        self, engine_id: str, hashes: Sequence[BlockHash]
    ) -> tuple[list[np.ndarray | None], KVStoreChanges]:
        """The KV of the leading `hashes` it holds (touched), and the changes since the engine's last
        call."""
        kvs = []
        for h in hashes:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            kvs.append(self._blocks[h])
        return kvs, self._changes(engine_id)

    async def changes(self, engine_id: str) -> KVStoreChanges:
        """What the store gained and lost since `engine_id`'s last call."""
        return self._changes(engine_id)

    def _changes(self, engine_id: str) -> KVStoreChanges:
        """The log from `engine_id`'s cursor on; what every engine has read is dropped."""
        entries = self._log[self._cursors[engine_id] - self._log_start :]
        self._cursors[engine_id] = self._log_start + len(self._log)
        low = min(self._cursors.values())
        if low - self._log_start > 4096:  # (dropped in chunks: a slice per call would copy the log)
            del self._log[: low - self._log_start]
            self._log_start = low
        return KVStoreChanges(entries)
