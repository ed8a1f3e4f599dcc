"""The P/D connector (NIXL-style, vLLM's `NixlConnector`): an engine's KV handoffs with its peers, over
the connector's scheduler side (`pd_scheduler.py`) and worker side (`pd_worker.py`): the source side
(held KV read, freed, expired) and the receiving side (push notices, loads run in the background,
failed loads recomputed or failed), and, bidirectional, decode's turns pulled back by prefill.

    prefill (source)                       decode (receiving)
    finished: KV held ── get_kv(pull) ───▶ start_load at admission ── load ── noticed at a step
            freed ◀──── free_kv ────────── notify_done once noticed (or the request ended first)
"""

from __future__ import annotations

import math
from collections.abc import Callable

from actors.engine.background import Background
from actors.engine.kv_connectors.base import KVConnector
from actors.engine.kv_connectors.pd_scheduler import PDConnectorScheduler
from actors.engine.kv_connectors.pd_worker import KVLoadError, KVNotHeldError, PDConnectorWorker
from actors.engine.kv_connectors.transfer import TransferPlan
from actors.engine.request import Request
from actors.engine.scheduling.scheduled_batch import ScheduledBatch
from actors.engine.scheduling.scheduler import Scheduler
from actors.engine.stats import EngineStats
from actors.engine.step_clock import StepClock
from messages import FinishedReason, KVPayload, KVPull, KVTransferParams


class PDConnector(KVConnector):
    """`abort(request_id, reason, error)`: end a request as the engine does."""

    def __init__(
        self,
        engine_id: str,
        *,
        scheduler: Scheduler,
        kv_scheduler: PDConnectorScheduler,
        kv_worker: PDConnectorWorker,
        stats: EngineStats,
        step_clock: StepClock,
        abort: Callable[[str, FinishedReason, str | None], None],
    ) -> None:
        self.engine_id = engine_id
        self.scheduler = scheduler
        self.kv_scheduler = kv_scheduler
        self.kv_worker = kv_worker
        self.stats = stats
        self.step_clock = step_clock
        self.abort = abort
        self._early_pushes: dict[str, KVTransferParams] = {}
        """Push: prefill's notices for requests not here yet (or aborted; dropped at `clear`)."""
        self._background = Background()

    # ---- source side (prefill role) ----------------------------------------------------------------

    async def get_kv(self, pull: KVPull) -> KVPayload:
        """The held KV `pull` asks for; its transfer queues on this engine's link (`KVSource`)."""
        req = self.scheduler.held.get(pull.request_id)
        if req is None:
            raise KVNotHeldError(f"engine {self.engine_id} holds no KV for request {pull.request_id!r}")
        return await self.kv_worker.read(req, pull)

    def free_kv(self, request_id: str) -> None:
        """A peer is done with the KV held for `request_id`; a notice for KV no longer held (expired
        before the peer finished, as NIXL counts it) frees nothing."""
        self.step_clock.wake()  # freed blocks may admit a waiting request
        if self.scheduler.release_held(request_id) is None:
            self.stats.on_kv_notification_after_expiry()

    def expire_held(self, now: float) -> None:
        """Release KV no decode engine pulled within kv_transfer.hold_timeout_s (its decode died)."""
        num_expired = self.kv_scheduler.expire_held(now)
        if num_expired:
            self.stats.on_kv_expired(num_expired)

    # ---- receiving side (decode role; prefill pulling back) ----------------------------------------

    def kv_ready(self, req: Request | None, request_id: str, kv_transfer_params: KVTransferParams) -> None:
        """Push: prefill finished `request_id` (`req` here, None: not yet); the push starts once this
        engine has blocks for it too."""
        if req is None:  # not here yet (another actor call may overtake the request), or aborted
            self._early_pushes[request_id] = kv_transfer_params
            return
        plan = self.kv_scheduler.push_ready(req, kv_transfer_params)
        if plan is not None:
            self._background.run(self._load(req, plan))

    def on_added(self, req: Request) -> None:
        """A new request: a hybrid's prefill request leaves its last prompt token to decode; if
        prefill's notice overtook it, its KV can move once it has blocks."""
        self.kv_scheduler.on_new_request(req)
        early = self._early_pushes.pop(req.request_id, None)
        if early is not None:
            self.kv_scheduler.push_ready(req, early)

    def start_load(self, req: Request, now: float) -> None:
        """`req` just got blocks for its remote KV: the load starts (a push not ready yet: `kv_ready`)."""
        plan = self.kv_scheduler.start_load(req, now)
        if plan is not None:
            self._background.run(self._load(req, plan))

    def start_loads(self, batch: ScheduledBatch, now: float) -> None:
        """The batch's requests that just got blocks for a peer's KV start loading it."""
        for req in batch.new_remote_requests:
            self.start_load(req, now)

    def get_finished(self, now: float) -> list[Request]:
        """Step boundary: loads done by `now` (they join the scheduler's queue); the peers they came
        from are told they may free their KV."""
        noticed = self.kv_scheduler.notice_loaded(now)
        for req in noticed:
            self.notify_done(req)
        return noticed

    def upcoming(self, since: float) -> list[float]:
        """Loads already moved and held KV coming up for expiry (`PDConnectorScheduler.upcoming`)."""
        return self.kv_scheduler.upcoming(since)

    def request_finished(self, req: Request, reason: FinishedReason, now: float) -> KVTransferParams | None:
        """What `req` hands on (`PDConnectorScheduler.request_finished`); its prefill engine is told it
        may free the KV it still holds for it (and that of a request refused on arrival)."""
        params, holding = self.kv_scheduler.request_finished(req, reason, now)
        if holding or (reason == "rejected" and req.is_remote_prefill):
            self.notify_done(req)
        return params

    def notify_done(self, req: Request) -> None:
        """Tell `req`'s source engine it may free the KV (in the background)."""
        self._background.run(self.kv_worker.notify_done(req))

    def drain(self) -> None:
        """At drain: KV nobody will pull is released, notices for requests that never came dropped."""
        self.expire_held(math.inf)
        self._early_pushes.clear()

    async def _load(self, req: Request, plan: TransferPlan) -> None:
        """Move `req`'s KV from its source engine into this engine's blocks (noticed at the next step
        boundary); a failed pull fails the request or computes its prompt here (by policy), a failed
        pull back computes those tokens here."""
        try:
            if not await self.kv_worker.load(req, plan):
                return  # aborted meanwhile
        except KVLoadError as e:
            if self.kv_scheduler.on_load_failed(req):
                self.kv_scheduler.recompute_instead(req)
                self.stats.on_kv_load_recomputed(req.is_pull_back)
            else:
                self.abort(req.request_id, "error", str(e))
        else:
            self.kv_scheduler.on_loaded(req)
        self.step_clock.wake()
