"""What every KV connector offers the engine's step loop (vLLM's `KVConnectorBase_V1`, the parts an
emulated engine drives): KV from outside the GPU prefix cache loaded into a request's blocks, and a
finished request's KV handed on or stored.

    a request arrives            on_added
    it got blocks for KV         start_loads            (vLLM: update_state_after_alloc)
    a step boundary              get_finished           (vLLM: get_finished: loads done join the queue)
    the loop would sleep         upcoming               (the connector's own events to wake for)
    it ends                      request_finished       (what it hands on; stores, notices)

Each connector does nothing where it has nothing to do; the engine composes its connectors in a
`MultiConnector` (`multi.py`).
"""

from __future__ import annotations

from abc import ABC

from actors.engine.request import Request
from actors.engine.scheduling.scheduled_batch import ScheduledBatch
from messages import BlockRemoved, BlockStored, FinishedReason, KVTransferParams


class KVConnector(ABC):  # noqa: B024  (every hook has a default: a connector overrides what it does)
    def on_added(self, req: Request) -> None:
        """A request arrived."""
        return

    def start_loads(self, batch: ScheduledBatch, now: float) -> None:
        """The batch's requests that just got blocks for KV from this connector start loading it."""
        return

    def get_finished(self, now: float) -> list[Request]:
        """Requests whose load is done by `now` (the engine gives them to its scheduler)."""
        return []

    def upcoming(self, since: float) -> list[float]:
        """Emulated times of this connector's own events after `since`."""
        return []

    def request_finished(self, req: Request, reason: FinishedReason, now: float) -> KVTransferParams | None:
        """`req` ended (before the scheduler frees its blocks): what it hands on (None: nothing)."""
        return None

    def take_kv_events(self) -> list[BlockStored | BlockRemoved]:
        """Blocks its tiers stored and evicted since the last call (for a KV-aware router)."""
        return []

    def assert_empty(self) -> None:
        """Nothing of a finished run left behind."""
        return
