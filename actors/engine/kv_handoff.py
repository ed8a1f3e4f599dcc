"""An engine's KV handoffs, between its entry points and step loop and its KV connector (vLLM's split
into a scheduler-side and a worker-side connector): the source side (held KV read, freed, expired)
and the receiving side (push notices, loads run in the background, failed loads recomputed or failed).

    prefill (source)                       decode (receiving)
    finished: KV held ── get_kv(pull) ───▶ start_load at admission ── load ── noticed at a step
            freed ◀──── free_kv ────────── notify_done once noticed (or the request ended first)
"""

from __future__ import annotations

import math
from collections.abc import Callable

from actors.engine.background import Background
from actors.engine.kv_connector import KVConnectorScheduler
from actors.engine.kv_connector_worker import KVConnectorWorker, KVLoadError, KVNotHeldError
from actors.engine.kv_offload import KVOffload
from actors.engine.kv_transfer import TransferPlan
from actors.engine.request import Request
from actors.engine.scheduled_batch import ScheduledBatch
from actors.engine.scheduler import Scheduler
from actors.engine.stats import EngineStats
from actors.engine.step_clock import StepClock
from messages import FinishedReason, KVEvents, KVPayload, KVPull, KVTransferParams


class KVHandoff:
    """`abort(request_id, reason, error)`: end a request as the engine does."""

    def __init__(
        self,
        engine_id: str,
        *,
        scheduler: Scheduler,
        kv_scheduler: KVConnectorScheduler,
        kv_worker: KVConnectorWorker,
        stats: EngineStats,
        step_clock: StepClock,
        abort: Callable[[str, FinishedReason, str | None], None],
        offload: KVOffload | None = None,
    ) -> None:
        """`offload`: the engine's offloading connector (None: no offload tiers)."""
        self.offload = offload
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
        if self.scheduler.release_held(request_id) is None:
            self.stats.on_kv_notification_after_expiry()
        self.step_clock.wake()  # freed blocks may admit a waiting request

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
        if self.offload is not None:
            self.offload.on_added()
        early = self._early_pushes.pop(req.request_id, None)
        if early is not None:
            self.kv_scheduler.push_ready(req, early)

    def start_load(self, req: Request, now: float) -> None:
        """`req` just got blocks for its remote KV: the load starts (a push not ready yet: `kv_ready`)."""
        plan = self.kv_scheduler.start_load(req, now)
        if plan is not None:
            self._background.run(self._load(req, plan))

    def start_loads(self, batch: ScheduledBatch, now: float) -> None:
        """The batch's requests that just got blocks for KV from a peer or the offload tiers start
        loading it."""
        for req in batch.new_remote_requests:
            self.start_load(req, now)
        for req in batch.new_offload_loads:
            assert self.offload is not None
            self.offload.start_load(req, now)

    def notice_loaded(self, now: float) -> None:
        """Step boundary: loads done by `now` join the scheduler's queue; the peers they came from are
        told they may free their KV."""
        for req in self.kv_scheduler.notice_loaded(now):
            self.notify_done(req)
        for req in self.offload.notice_loaded(now) if self.offload is not None else ():
            self.scheduler.kv_received(req)

    def upcoming(self, since: float) -> list[float]:
        """Emulated times of the connectors' own events after `since` (`KVConnectorScheduler.upcoming`,
        offload loads ending)."""
        times = self.kv_scheduler.upcoming(since)
        return times + self.offload.upcoming(since) if self.offload is not None else times

    def request_finished(
        self, req: Request, reason: FinishedReason, now: float
    ) -> tuple[KVTransferParams | None, bool]:
        """`req` ended: its blocks go to the offload tiers (before the scheduler frees them); what it
        hands on (`KVConnectorScheduler.request_finished`)."""
        if self.offload is not None:
            self.offload.request_finished(req, now)
        return self.kv_scheduler.request_finished(req, reason, now)

    def take_kv_events(self) -> KVEvents | None:
        """What the GPU prefix cache and the offload tiers gained and lost since the last call (each
        tier's in order: a router keeps a set per tier), or None."""
        events = self.scheduler.blocks.take_kv_events()
        more = self.offload.take_kv_events() if self.offload is not None else []
        if not more:
            return events
        return KVEvents((events.events if events is not None else []) + more)

    def assert_empty(self) -> None:
        if self.offload is not None:
            self.offload.assert_empty()

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
