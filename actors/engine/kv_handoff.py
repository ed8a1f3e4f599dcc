"""An engine's KV handoffs, between its entry points and step loop and its KV connector (vLLM's split
into a scheduler-side and a worker-side connector): the source side (held KV read, freed, expired)
and the receiving side (push notices, loads run in the background, failed loads recomputed or failed).

    prefill (source)                       decode (receiving)
    finished: KV held ── get_kv(pull) ───▶ start_load at admission ── load ── noticed at a step
            freed ◀──── free_kv ────────── notify_done once noticed (or the request ended first)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from actors.engine.kv_connector import KVConnectorScheduler
from actors.engine.kv_connector_worker import KVConnectorWorker, KVLoadError
from actors.engine.kv_transfer import TransferPlan
from actors.engine.request import Request
from actors.engine.scheduler import Scheduler
from actors.engine.stats import EngineStats
from actors.engine.step_clock import StepClock
from messages import FinishedReason, KVPayload, KVPull, KVTransferParams


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
        self._tasks: set[asyncio.Future[None]] = set()

    # ---- source side (prefill role) ----------------------------------------------------------------

    async def get_kv(self, pull: KVPull) -> KVPayload:
        """The held KV `pull` asks for; its transfer queues on this engine's link (`KVSource`)."""
        req = self.scheduler.held.get(pull.request_id)
        if req is None:
            raise KeyError(f"engine {self.engine_id} holds no KV for request {pull.request_id!r}")
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
            self._background(self._load(req, plan))

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
            self._background(self._load(req, plan))

    def notify_done(self, req: Request) -> None:
        """Tell `req`'s source engine it may free the KV (in the background)."""
        self._background(self.kv_worker.notify_done(req))

    def clear(self) -> None:
        """At drain: notices for requests that never came are dropped."""
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
                self.scheduler.recompute_instead(req)
                self.stats.on_kv_load_recomputed(req.is_pull_back)
            else:
                self.abort(req.request_id, "error", str(e))
        else:
            self.kv_scheduler.on_loaded(req)
        self.step_clock.wake()

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` as a task kept until it ends (a reference, so that it is not collected); its
        errors are dropped."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
