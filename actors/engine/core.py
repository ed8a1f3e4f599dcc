"""The engine core: one step loop for every role (`mixed`, `prefill`, `decode`).

Who calls what:
  - a composition root builds the collaborators (scheduler, KV connector, executor, stats) and an
    `EngineCore` over them, injects peers (prefill engines, by id) and `start()`s it on the loop that
    owns its clock; `drain()` stops it;
  - the proxy calls `generate(request)` and iterates its outputs;
  - a decode engine calls a prefill engine's `get_kv` and `free_kv` during a handoff.

One step::

    start ── schedule ── execute (runner) ── update from output ── sleep until start + t_step
                                             (tokens out, stamped at the end)   (t_step: the roofline)

With `macro_steps` (virtual mode, compute skip), a steady stretch of steps (decodes, perhaps one prompt
in chunks) runs as one event (`window`), with the same stamps, tokens, counters and metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Literal

from actors.engine.clock import Clock
from actors.engine.health import EngineHealth
from actors.engine.kv_connectors.base import KVConnector
from actors.engine.kv_connectors.multi import MultiConnector
from actors.engine.kv_connectors.pd import PDConnector
from actors.engine.kv_connectors.pd_scheduler import PDConnectorScheduler
from actors.engine.kv_connectors.pd_worker import PDConnectorWorker
from actors.engine.request import Request, RequestStatus, check_request
from actors.engine.runner.executor import Executor
from actors.engine.scheduling.admission import Admission, Refusal
from actors.engine.scheduling.scheduled_batch import ScheduledBatch
from actors.engine.scheduling.scheduler import Scheduler
from actors.engine.stats import EngineStats
from actors.engine.step_clock import StepClock
from actors.engine.streams import OutputStreams
from actors.engine.window.run import Windows
from emulation.time_model import StepTimeModel
from emulation.vision import EncoderRoofline
from messages import (
    EngineOutput,
    EngineRequest,
    FinishedReason,
    KVEvents,
    KVPayload,
    KVPull,
    KVTransferParams,
)
from messages.stats import NO_WORK, EngineReport, StepWork

Role = Literal["mixed", "prefill", "decode"]


class EngineCore:
    """The step loop with the APIs it serves (clients, the KV source, push notices), each call a change
    to what the next step schedules, which first wakes the step loop (`StepClock.wake`: it ends a window
    under way). Every concern is a collaborator; what stays is the order of events."""

    def __init__(
        self,
        engine_id: str,
        *,
        role: Role,
        clock: Clock,
        step_clock: StepClock,
        time_model: StepTimeModel,
        scheduler: Scheduler,
        executor: Executor,
        kv_scheduler: PDConnectorScheduler,
        kv_worker: PDConnectorWorker,
        stats: EngineStats,
        max_model_len: int,
        encoder_roofline: EncoderRoofline | None = None,
        macro_steps: bool = False,
        admission: Admission | None = None,
        kv_connectors: Sequence[KVConnector] = (),
    ) -> None:
        """`encoder_roofline`: the vision encoder's time, run in this engine's steps (None: text only,
        images refused). `macro_steps`: run steady stretches of steps as one event (`window`) where the
        clock is virtual and nothing computes. `admission`: its limits (None: none, as vLLM).
        `kv_connectors`: its KV connectors beside the P/D one (its offload tiers')."""
        self.engine_id = engine_id
        self.role = role
        self.clock = clock
        self.max_model_len = max_model_len
        self.time_model = time_model
        self.encoder_roofline = encoder_roofline
        self.scheduler = scheduler
        self.executor = executor
        self.stats = stats
        self.kv_scheduler = kv_scheduler
        self.kv_worker = kv_worker
        self.admission = admission or Admission(engine_id, scheduler=scheduler)
        self._requests: dict[str, Request] = {}
        self._loop_task: asyncio.Future[None] | None = None
        self.step_clock = step_clock
        self._stopped = False
        self.health = EngineHealth(engine_id)
        self.streams = OutputStreams()
        self.windows = Windows(
            clock=clock,
            step_clock=step_clock,
            scheduler=scheduler,
            time_model=time_model,
            stats=stats,
            streams=self.streams,
            finish=self._finish,
            allowed=macro_steps and clock.virtual and executor.runner is None,
        )
        self.pd = PDConnector(
            engine_id,
            scheduler=scheduler,
            kv_scheduler=kv_scheduler,
            kv_worker=kv_worker,
            stats=stats,
            step_clock=step_clock,
            abort=self.abort,
        )
        """Its handoffs with peer engines (prefill and decode, pulls back)."""
        self.kv = MultiConnector([self.pd, *kv_connectors])

    # ---- client side -------------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        """Stream a request's outputs; closing the iterator early aborts the request."""
        await self.check_health()
        if request.request_id in self._requests:
            raise ValueError(f"request_id {request.request_id!r} is already in engine {self.engine_id}")
        vocab = self.executor.vocab_size if self.executor.runner is not None else None  # what it guards
        check_request(request, self.max_model_len, vocab, self.encoder_roofline is not None)
        sent = request.arrival_time_s
        req = Request(request, self.clock.now() if sent is None else sent)
        self.step_clock.wake()  # (first: admission reads the state the steps begun by now made)
        if (refusal := self.admission.refusal(req.times.queued_s)) is not None:
            yield self._refused(req, refusal)
            return
        stream = self.streams.open(req.request_id)
        self._requests[req.request_id] = req
        self.kv.on_added(req)
        self.scheduler.add(req)
        try:
            async for out in stream.outputs(req.request_id, self._take_kv_events):
                if self.health.dead is not None and out.finished_reason == "error":
                    raise self.health.dead  # as a dead actor's stream breaks (the proxy may retry elsewhere)
                yield out
        finally:
            if stream.final is None:
                self.abort(req.request_id)
            self.streams.close(req.request_id)

    async def check_health(self) -> None:
        """Raise `EngineDeadError` if the step loop broke or was killed (vLLM's `check_health`)."""
        self.health.check()

    def abort(self, request_id: str, reason: FinishedReason = "abort", error: str | None = None) -> None:
        self.step_clock.wake()  # its blocks may admit a waiting request
        req = self._requests.get(request_id)
        if req is not None and req.status is not RequestStatus.FINISHED:
            self._finish(req, reason, self.clock.now(), error)

    # ---- KV source side (prefill role) --------------------------------------------------------------

    async def get_kv(self, pull: KVPull) -> KVPayload:
        """The held KV `pull` asks for; its transfer queues on this engine's link (`KVSource`)."""
        await self.check_health()
        return await self.pd.get_kv(pull)

    async def free_kv(self, request_id: str) -> None:
        self.pd.free_kv(request_id)

    async def kv_ready(self, request_id: str, kv_transfer_params: KVTransferParams) -> None:
        """Push, decode side: prefill finished `request_id`; its KV moves once this engine has blocks too."""
        self.step_clock.wake()
        self.pd.kv_ready(self._requests.get(request_id), request_id, kv_transfer_params)

    # ---- the step loop -----------------------------------------------------------------------------

    def start(self) -> None:
        """Run the step loop as a task on the current loop, until `drain()`."""
        self._loop_task = asyncio.ensure_future(self.run())

    async def drain(self) -> None:
        """Stop the step loop, wait for it, and release KV nobody will pull (then `assert_empty`)."""
        self.step_clock.wake()
        self._stopped = True
        if self._loop_task is not None:
            await self._loop_task
        self.pd.drain()

    async def run(self) -> None:
        """The step loop, until drained. If it breaks, every request in it fails visibly, later ones
        are refused (`EngineDeadError`), and the loop's task ends with the error (`drain` raises it;
        not for a kill, which is on purpose)."""
        try:
            await self._step_loop()
        except Exception as e:
            killed = self.health.loop_broke(e)
            for rid in list(self._requests):
                with contextlib.suppress(Exception):  # each request must still hear of it
                    self.abort(rid, "error", str(self.health.dead))
            if not killed:
                raise

    def inject(self, fault: Literal["kill", "hang"], why: str) -> None:
        """A fault on purpose, met after the step under way. kill (`faults.engine_kills`): the loop stops
        as if it broke (`run`); hang (`engine_hangs`: a wedged GPU or process): no more steps, requests
        wait without an error (aborts are still heard: a client's timeout frees them) until `drain`."""
        self.step_clock.wake()
        self.health.inject(fault, why)

    async def _step_loop(self) -> None:
        # The next step starts at the previous one's scheduled end (`StepClock`), or from the clock.
        scheduled: float | None = None
        while not self._stopped:
            if self.health.killed is not None:
                raise self.health.killed
            if self.health.hung_why is not None:  # only a wake-up (a drain's) may end the wait
                await self.step_clock.idle(self.clock.now(), lambda since: [])
                continue
            now = self.clock.now() if scheduled is None else scheduled
            scheduled = None
            self.pd.expire_held(now)
            for req, refusal in self.admission.expired(now):
                self._finish(req, "rejected", now, refusal.why, refusal.limit)
            for req in self.kv.get_finished(now):  # their KV is in: they join the queue
                self.scheduler.kv_received(req)
            batch = self._schedule(now)
            if batch is None or batch.num_scheduled_tokens == 0:
                self.stats.on_state(self.scheduler)
                if batch is None or not batch.new_remote_requests:
                    scheduled = await self.step_clock.idle(now, self._upcoming)
                continue
            scheduled = await self._step(batch, now)

    def _schedule(self, now: float) -> ScheduledBatch | None:
        """The next batch (None: nothing to run); preempted requests drop their working KV, requests
        that just got blocks for remote KV start loading it."""
        if not self.scheduler.has_schedulable_work():
            return None
        batch = self.scheduler.schedule(now)
        for req in batch.preempted:
            self.executor.release(req.request_id)
        for req in batch.pull_backs_taking_nothing:
            self.pd.notify_done(req)
        self.kv.start_loads(batch, now)
        return batch

    async def _step(self, batch: ScheduledBatch, start: float) -> float:
        """Compute `batch`, emit its tokens stamped at the step's end, sleep until then; the end."""
        if window := self.windows.plan(batch, start, self._upcoming):
            return await self.windows.run(window)
        await self.executor.encode(batch.encoder_inputs, self.scheduler.encoder_cache)
        sampled = await self.executor.execute(batch)
        step = self.time_model.step_time_of(batch.shape)
        images = [item.num_tokens for _, item in batch.encoder_inputs]  # encoded first, on the same GPU
        encode_s = self.encoder_roofline.visual_tokens_time(images).total_s if self.encoder_roofline else 0.0
        end = start + encode_s + step.total_s
        # Outputs leave when computed, stamped with the step's end (a peer gets them in time for its step).
        for req, token, stop in self.scheduler.update_from_output(batch, sampled, start, step.total_s):
            self.stats.on_token(req, end)
            self.streams.push(req.request_id, token, end)
            if stop is not None:
                self._finish(req, stop, end)
        overrun = await self.clock.sleep_until(end)
        n = batch.num_scheduled_tokens
        work = StepWork.of(step) if self.stats.reads_work else NO_WORK
        self.stats.on_step(encode_s + step.total_s, n, overrun, step.overhead_s, work, step.measured_s)
        self.stats.on_state(self.scheduler)
        return end

    def listen_kv_events(self, listener: Callable[[KVEvents], None]) -> Callable[[], None]:
        """In process (a composition root calls it): this engine's KV events go to `listener` as its
        outputs leave; returns what to call before reading them (`Windows.read_in_process`)."""
        self.streams.hand_over_kv_events(self._take_kv_events, listener)
        return self.windows.read_in_process()

    def _take_kv_events(self) -> KVEvents | None:
        """What the GPU prefix cache and the connectors' tiers gained and lost since the last call
        (each tier's in order: a router keeps a set per tier), or None."""
        events = self.scheduler.blocks.take_kv_events()
        more = self.kv.take_kv_events()
        if not more:
            return events
        return KVEvents((events.events if events is not None else []) + more)

    def _upcoming(self, since: float) -> list[float]:
        """Emulated times of known events the scheduler has not seen at `since`: requests queued after
        it, and the KV connector's (loads already moved, held KV coming up for expiry). A request queued
        by `since` was seen (only a freed block or a finished request, which wake the loop, change what
        that schedule did with it): counting it would make an idle engine spin."""
        times = [r.times.queued_s for r in self.scheduler.waiting if r.times.queued_s > since]
        return times + self.kv.upcoming(since) + self.admission.next_deadline(since)

    def _finish(
        self,
        req: Request,
        reason: FinishedReason,
        now: float,
        error: str | None = None,
        rejected_by: str | None = None,
    ) -> None:
        params = self.kv.request_finished(req, reason, now)
        req.times.finished_s = now
        self.admission.finished(req)
        self._requests.pop(req.request_id, None)
        try:
            self.stats.on_request_finished(req, reason)
            self.scheduler.finish(req, reason)
            self.executor.release(req.request_id)
        finally:  # whatever broke, the client hears how its request ended
            out = EngineOutput(
                req.request_id, [], [], reason, params, req.times, error, rejected_by=rejected_by
            )
            self.streams.finish(out)

    def _refused(self, req: Request, refusal: Refusal) -> EngineOutput:
        """`req` refused on arrival (`admission`): nothing computed; its prefill engine may free its KV."""
        self.stats.on_admission_rejected(refusal.limit)
        if req.is_remote_prefill:
            self.pd.notify_done(req)
        why, limit = refusal.why, refusal.limit
        return EngineOutput(req.request_id, [], [], "rejected", None, req.times, why, rejected_by=limit)

    def report(self) -> EngineReport:
        """Counters of this engine's life so far (steps, lag, preemptions, prefix cache, handoffs)."""
        return self.stats.report(self.role, self.scheduler, len(self._requests), self.health)

    # ---- invariants --------------------------------------------------------------------------------

    def assert_empty(self) -> None:
        """No request, block, stream or working KV left (call after a run has drained)."""
        assert not self._requests, f"{self.engine_id}: requests left: {list(self._requests)[:10]}"
        self.streams.assert_empty(self.engine_id)
        self.scheduler.assert_empty()
        self.executor.assert_empty()
        self.kv.assert_empty()
