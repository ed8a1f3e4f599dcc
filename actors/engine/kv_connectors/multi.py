"""An engine's KV connectors as one (vLLM's `MultiConnector`): each hook goes to every connector in
order; a finished request hands on the first connector's parameters that it has any."""

from __future__ import annotations

from collections.abc import Sequence

from actors.engine.kv_connectors.base import KVConnector
from actors.engine.request import Request
from actors.engine.scheduling.scheduled_batch import ScheduledBatch
from messages import BlockRemoved, BlockStored, FinishedReason, KVTransferParams


class MultiConnector(KVConnector):
    def __init__(self, connectors: Sequence[KVConnector]) -> None:
        self.connectors = connectors

    def on_added(self, req: Request) -> None:
        for c in self.connectors:
            c.on_added(req)

    def start_loads(self, batch: ScheduledBatch, now: float) -> None:
        for c in self.connectors:
            c.start_loads(batch, now)

    def get_finished(self, now: float) -> list[Request]:
        return [req for c in self.connectors for req in c.get_finished(now)]

    def upcoming(self, since: float) -> list[float]:
        return [t for c in self.connectors for t in c.upcoming(since)]

    def request_finished(self, req: Request, reason: FinishedReason, now: float) -> KVTransferParams | None:
        handed = [c.request_finished(req, reason, now) for c in self.connectors]
        return next((params for params in handed if params is not None), None)

    def take_kv_events(self) -> list[BlockStored | BlockRemoved]:
        return [event for c in self.connectors for event in c.take_kv_events()]

    def assert_empty(self) -> None:
        for c in self.connectors:
            c.assert_empty()
