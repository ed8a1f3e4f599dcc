"""The engine: one step loop for every role (`mixed`, `prefill`, `decode`).

Who calls what:
  - the composition root builds an `EngineCore`, injects peers (other engines, by id) and starts
    `run()` as a task on the loop that owns the engine's clock;
  - the proxy calls `generate(request)` and iterates its outputs;
  - a decode engine calls a prefill engine's `get_kv` and `free_kv` during a handoff.

One step::

    start ── schedule ── real compute (runner) ── sleep until start + t_step ── outputs stamped at end
                                                   (t_step from the roofline)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from actors.engine.block_manager import BlockManager
from actors.engine.clock import Clock
from actors.engine.kv_transfer import KVReceiver, TransferPlan
from actors.engine.request import Request, RequestStatus
from actors.engine.scheduler import ScheduledBatch, Scheduler
from actors.messages import EngineOutput, EngineRequest, FinishedReason, KVPayload, token_ids_valid
from cluster.config import PoolConfig, TestbedConfig
from cluster.profiles import LINKS
from cluster.roofline import roofline_for
from dashboards.recorders import EngineMetrics

if TYPE_CHECKING:  # torch loads only where a runner computes (compute skip engines stay light)
    from actors.engine.runner import ModelRunner

Role = Literal["mixed", "prefill", "decode"]


def num_gpu_blocks(cfg: TestbedConfig, pool: PoolConfig) -> int:
    """KV blocks of one replica: the target GPUs' memory minus weights, unless overridden."""
    s = cfg.scheduler
    if s.num_gpu_blocks_override:
        return s.num_gpu_blocks_override
    return roofline_for(cfg, pool).kv_capacity_tokens(cfg.target.gpu_memory_utilization) // s.block_size


def runner_for(cfg: TestbedConfig, pool: PoolConfig) -> ModelRunner | None:
    """The model runner of one replica of `pool`, or None with compute skip (then torch never loads)."""
    if cfg.runner.compute != "real":
        return None
    from actors.engine.runner import ModelRunner
    from actors.engine.runner_model import load_model

    r = cfg.runner
    return ModelRunner(load_model(r), num_gpu_blocks(cfg, pool), cfg.scheduler.block_size, r.num_threads)


class KVSource(Protocol):
    """What a decode engine needs of a prefill engine (the engine itself, or a handle to its actor)."""

    async def get_kv(self, request_id: str) -> KVPayload: ...

    async def free_kv(self, request_id: str) -> None: ...


@dataclass
class EngineStats:
    num_steps: int = 0
    num_scheduled_tokens: int = 0
    max_num_scheduled_tokens: int = 0
    busy_s: float = 0.0
    """Emulated seconds spent in steps."""
    num_finished: int = 0
    num_lagged_steps: int = 0
    """Steps whose real work (plus the wake-up before it) overran the emulated budget."""
    num_transfers: int = 0
    num_lagged_transfers: int = 0
    """KV pulls whose real move finished after the emulated transfer did."""
    max_overrun_s: float = 0.0
    """Worst overrun of a step or transfer, in emulated seconds."""
    num_expired_handoffs: int = 0
    """Prefill side: held KV released because no decode engine pulled it in time."""


class _Stream:
    """Tokens produced for one request and not yet taken by its consumer."""

    __slots__ = ("event", "final", "times", "tokens")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.times: list[float] = []
        self.event = asyncio.Event()
        self.final: EngineOutput | None = None


class EngineCore:
    def __init__(
        self,
        engine_id: str,
        role: Role,
        cfg: TestbedConfig,
        pool: PoolConfig,
        clock: Clock,
        runner: ModelRunner | None,
        peers: Mapping[str, KVSource] | None = None,
        compute_in_thread: bool = False,
        replica: int = 0,
    ) -> None:
        """`compute_in_thread` (live mode): run the forward pass off the event loop, so a decode engine's
        KV pull is served while this engine computes (torch releases the GIL). Not on a virtual loop,
        whose time would jump while the thread works. `replica`: index in its pool (a metrics label)."""
        self.engine_id = engine_id
        self.compute_in_thread = compute_in_thread
        self.role = role
        self.cfg = cfg
        self.clock = clock
        self.runner = runner
        self.peers: Mapping[str, KVSource] = peers if peers is not None else {}
        self.roofline = roofline_for(cfg, pool)
        s = cfg.scheduler
        self.num_gpu_blocks = num_gpu_blocks(cfg, pool)
        self.blocks = BlockManager(self.num_gpu_blocks, s.block_size, s.enable_prefix_caching)
        self.scheduler = Scheduler(self.blocks, s.max_num_batched_tokens, s.max_num_seqs)
        self.kv_receiver = KVReceiver(
            cfg.kv_transfer, LINKS[cfg.kv_transfer.link], self.roofline.model, s.block_size
        )
        self.stats = EngineStats()
        self.metrics = EngineMetrics(cfg, role, replica)
        self._streams: dict[str, _Stream] = {}
        self._requests: dict[str, Request] = {}
        self._kv_arrived: set[str] = set()
        self._tasks: set[asyncio.Future[None]] = set()
        self._wake = asyncio.Event()
        self._stopped = False

    # ---- client side -------------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        """Stream a request's outputs; closing the iterator early aborts the request."""
        if request.request_id in self._requests:
            raise ValueError(f"request_id {request.request_id!r} is already in engine {self.engine_id}")
        n = len(request.prompt_token_ids) + request.max_tokens
        if n > self.cfg.scheduler.max_model_len:
            raise ValueError(
                f"request {request.request_id!r}: prompt ({len(request.prompt_token_ids)} tokens) + "
                f"max_tokens ({request.max_tokens}) = {n} exceeds max_model_len "
                f"({self.cfg.scheduler.max_model_len})"
            )
        vocab = self.cfg.runner.vocab_size
        if not token_ids_valid(request.prompt_token_ids, vocab):
            raise ValueError(f"request {request.request_id!r}: prompt token IDs must be ints in [0, {vocab})")
        sent = request.arrival_time_s
        req = Request(request, self.clock.now() if sent is None else sent)
        stream = _Stream()
        self._requests[req.request_id] = req
        self._streams[req.request_id] = stream
        self.scheduler.add(req)
        self._wake.set()
        try:
            while True:
                await stream.event.wait()
                stream.event.clear()
                out = stream.final or EngineOutput(req.request_id, [], [])
                out.new_token_ids, out.token_times_s = stream.tokens, stream.times
                stream.tokens, stream.times = [], []
                yield out
                if out.finished_reason is not None:
                    return
        finally:
            if stream.final is None:
                self.abort(req.request_id)
            self._streams.pop(req.request_id, None)

    def abort(self, request_id: str, reason: FinishedReason = "abort", error: str | None = None) -> None:
        req = self._requests.get(request_id)
        if req is not None and req.status is not RequestStatus.FINISHED:
            self._finish(req, reason, self.clock.now(), error)
            self._wake.set()  # its blocks may admit a waiting request

    # ---- KV source side (prefill role) --------------------------------------------------------------

    async def get_kv(self, request_id: str) -> KVPayload:
        req = self.scheduler.held.get(request_id)
        if req is None:
            raise KeyError(f"engine {self.engine_id} holds no KV for request {request_id!r}")
        kv = self.runner.read_kv(req.block_ids, req.num_prompt_tokens) if self.runner else None
        return KVPayload(request_id, kv)

    def expire_held(self, now: float) -> None:
        """Release KV that no decode engine pulled within kv_transfer.hold_timeout_s (its decode died)."""
        timeout = self.cfg.kv_transfer.hold_timeout_s
        held = self.scheduler.held
        for rid in [
            r
            for r, req in held.items()
            if req.times.finished_s is not None and req.times.finished_s + timeout <= now
        ]:
            self.scheduler.release_held(rid)
            self.stats.num_expired_handoffs += 1
            self.metrics.on_kv_expired(1)

    async def free_kv(self, request_id: str) -> None:
        self.scheduler.release_held(request_id)
        self._wake.set()  # freed blocks may admit a waiting request

    # ---- the step loop -----------------------------------------------------------------------------

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()

    async def run(self) -> None:
        """The step loop, until `stop()`. If it breaks, every request in it fails visibly."""
        try:
            await self._step_loop()
        except Exception as e:
            for rid in list(self._requests):
                with contextlib.suppress(Exception):  # each request must still hear of the crash
                    self.abort(rid, "error", f"engine {self.engine_id} crashed: {e!r}")
            raise

    async def _step_loop(self) -> None:
        # Back-to-back steps start at the previous step's scheduled end, not when the sleep returned:
        # wake-up jitter must not accumulate into emulated time. After idling, start from the clock.
        scheduled: float | None = None
        while not self._stopped:
            now = self.clock.now() if scheduled is None else scheduled
            scheduled = None
            self.expire_held(now)
            self._notice_transfers(now)
            batch = self.scheduler.schedule(now) if self.scheduler.has_schedulable_work() else None
            if batch is not None:
                for req in batch.preempted:
                    if self.runner:
                        self.runner.release(req.request_id)
                for req in batch.new_remote_requests:
                    self._start_transfer(req, now)
            if batch is None or batch.num_scheduled_tokens == 0:
                self.metrics.on_state(self.scheduler, self.blocks)
                if batch is None or not batch.new_remote_requests:
                    scheduled = await self._idle(now)
                continue
            if self.compute_in_thread and self.runner is not None:
                sampled = await asyncio.to_thread(self._execute, batch)
            else:
                sampled = self._execute(batch)
            step = self.roofline.step_time_totals(
                batch.num_scheduled_tokens, batch.keys_attended, batch.num_logits, batch.num_context_tokens
            )
            end = now + step.total_s
            # Outputs leave as soon as they are computed, stamped with the step's end: consumers read
            # the stamps, and a peer on another actor gets the request early enough not to miss a step.
            self._update(batch, sampled, now, end)
            overrun = await self.clock.sleep_until(end)
            scheduled = end
            st = self.stats
            if overrun > 0:
                st.num_lagged_steps += 1
                st.max_overrun_s = max(st.max_overrun_s, overrun)
            st.num_steps += 1
            st.num_scheduled_tokens += batch.num_scheduled_tokens
            st.max_num_scheduled_tokens = max(st.max_num_scheduled_tokens, batch.num_scheduled_tokens)
            st.busy_s += step.total_s
            self.metrics.on_step(
                step.total_s, batch.num_scheduled_tokens, overrun, self.scheduler, self.blocks
            )

    async def _idle(self, idle_since: float) -> float:
        """Sleep until there is work; return the emulated time of the event that brought it.

        That is a request's send time or a transfer's completion, not the moment the wake-up ran: in
        live mode the hops between actors must not shift emulated time (late real work is lag).
        """
        if not self._wake.is_set():
            upcoming = self._upcoming(idle_since)
            timeout = None
            if upcoming:
                timeout = max(0.0, min(upcoming) - self.clock.now()) * self.clock.time_scale
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
        self._wake.clear()
        now = self.clock.now()
        due = [t for t in self._upcoming(idle_since) if t <= now]
        return max(idle_since, min(due)) if due else now

    def _upcoming(self, since: float) -> list[float]:
        """Emulated times of known events the scheduler has not seen at `since`: requests queued after
        it, transfers already moved, held KV coming up for expiry.

        A request queued at or before `since` was visible to that schedule (if it could not run, only
        a freed block or a finished request changes that, and those wake the loop): counting it would
        make an idle engine spin. A moved transfer counts even at `since`: it is noticed only once the
        loop runs again.
        """
        times = [r.times.queued_s for r in self.scheduler.waiting if r.times.queued_s > since]
        for rid in self._kv_arrived:
            done = self._requests[rid].times.kv_transfer_done_s
            if done is not None and done >= since:
                times.append(done)
        timeout = self.cfg.kv_transfer.hold_timeout_s
        for req in self.scheduler.held.values():
            if req.times.finished_s is not None and req.times.finished_s + timeout > since:
                times.append(req.times.finished_s + timeout)
        return times

    def _execute(self, batch: ScheduledBatch) -> list[int | None]:
        if self.runner is None:
            return [None] * len(batch.requests)
        from actors.engine.runner import RunnerInput

        items = [
            RunnerInput(
                request_id=req.request_id,
                token_ids=req.token_ids(req.num_computed_tokens, req.num_computed_tokens + n),
                start_pos=req.num_computed_tokens,
                block_ids=req.block_ids,
                capacity=req.num_prompt_tokens + req.max_tokens,
                needs_logits=req.num_computed_tokens + n == req.num_tokens,
            )
            for req, n in zip(batch.requests, batch.num_new_tokens, strict=True)
        ]
        return self.runner.execute(items)

    def _update(self, batch: ScheduledBatch, sampled: list[int | None], start: float, end: float) -> None:
        for req, n, token in zip(batch.requests, batch.num_new_tokens, sampled, strict=True):
            if req.status is not RequestStatus.RUNNING:  # aborted while the step ran
                continue
            if req.times.first_scheduled_s is None:
                req.times.first_scheduled_s = start
            req.num_computed_tokens += n
            self.blocks.cache_full_blocks(req)
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk short of the end: no token yet
            forced = req.forced_output_token_ids
            if forced is not None:
                token = forced[len(req.output_token_ids)]
            assert token is not None, "greedy output needs real compute"
            self.metrics.on_new_token(req, end)
            req.output_token_ids.append(token)
            if req.times.first_token_s is None:
                req.times.first_token_s = end
            req.times.last_token_s = end
            stream = self._streams.get(req.request_id)
            if stream is not None:
                stream.tokens.append(token)
                stream.times.append(end)
                stream.event.set()
            if forced is None and token in req.stop_token_ids:
                self._finish(req, "stop", end)
            elif len(req.output_token_ids) >= req.max_tokens:
                self._finish(req, "length", end)
            elif forced is not None and len(req.output_token_ids) >= len(forced):
                self._finish(req, "stop", end)  # the forced answer is complete

    def _finish(self, req: Request, reason: FinishedReason, now: float, error: str | None = None) -> None:
        params = None
        if reason == "length" and req.is_remote_decode:
            first = req.times.first_scheduled_s
            params = {
                "do_remote_prefill": True,
                "remote_engine_id": self.engine_id,
                "remote_request_id": req.request_id,
                "remote_block_ids": list(req.block_ids),
                "remote_num_tokens": req.num_prompt_tokens,
                "prompt_token_ids": list(req.prompt_token_ids),
                "kv_sent_s": now,
                "prefill_compute_s": now - (now if first is None else first),
            }
        req.times.finished_s = now
        self._requests.pop(req.request_id, None)
        self._kv_arrived.discard(req.request_id)
        self.stats.num_finished += 1
        try:
            self.metrics.on_request_finished(req, reason)
            self.scheduler.finish(req, reason)
            if self.runner:
                self.runner.release(req.request_id)
        finally:  # whatever broke, the client hears how its request ended
            stream = self._streams.get(req.request_id)
            if stream is not None:
                stream.final = EngineOutput(req.request_id, [], [], reason, params, req.times, error)
                stream.event.set()

    # ---- KV handoff, receiving side (decode role) --------------------------------------------------

    def _start_transfer(self, req: Request, now: float) -> None:
        assert req.kv_transfer_params is not None
        plan = self.kv_receiver.plan(req.kv_transfer_params, now)
        req.times.kv_transfer_start_s = plan.start_s
        req.times.kv_transfer_done_s = plan.done_s
        req.times.kv_bytes = plan.kv_bytes
        self._background(self._pull_kv(req, plan))

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` as a task this engine keeps a reference to until it ends; its errors are dropped."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _pull_kv(self, req: Request, plan: TransferPlan) -> None:
        """Move the real KV from the prefill engine into this engine's blocks, then release it there."""
        params = req.kv_transfer_params
        assert params is not None
        remote_id, remote_req = str(params["remote_engine_id"]), str(params["remote_request_id"])
        try:
            peer = self.peers[remote_id]
            payload = await peer.get_kv(remote_req)
        except Exception as e:  # the prefill side died or lost the KV: the request fails, visibly
            self.metrics.on_kv_transfer_failed()
            self.abort(req.request_id, "error", f"KV pull from {remote_id} failed: {e!r}")
            self._wake.set()
            return
        # Releasing the prefill side's blocks is off the critical path.
        self._background(self._release_remote(peer, remote_req))
        if req.status is not RequestStatus.WAITING_FOR_REMOTE_KVS:
            return  # aborted meanwhile
        if self.runner is not None and payload.kv is not None:
            self.runner.write_kv(req.block_ids, payload.kv)
        st = self.stats
        st.num_transfers += 1
        overrun = self.clock.now() - plan.done_s
        if overrun > 0:
            st.num_lagged_transfers += 1
            st.max_overrun_s = max(st.max_overrun_s, overrun)
        self.metrics.on_kv_transfer_done(plan, len(params["remote_block_ids"]), overrun)
        self._kv_arrived.add(req.request_id)
        self._wake.set()

    async def _release_remote(self, peer: KVSource, remote_request_id: str) -> None:
        """Tell the prefill side it may free the KV (NIXL's notification); a dead peer has nothing to free."""
        try:
            await peer.free_kv(remote_request_id)
        except Exception:
            self.metrics.on_kv_notification_failed()

    def _notice_transfers(self, now: float) -> None:
        for rid in sorted(self._kv_arrived):
            req = self._requests[rid]
            if (req.times.kv_transfer_done_s or 0.0) <= now + 1e-12:
                self._kv_arrived.discard(rid)
                req.times.kv_noticed_s = now
                self.scheduler.kv_received(req)

    def report(self) -> dict[str, Any]:
        """Counters of this engine's life so far (steps, lag, preemptions, prefix cache, handoffs)."""
        return {
            "role": self.role,
            **vars(self.stats),
            "num_preemptions": self.scheduler.num_preemptions,
            "prefix_cache_queries": self.blocks.num_prefix_cache_queries,
            "prefix_cache_hits": self.blocks.num_prefix_cache_hits,
            "num_gpu_blocks": self.num_gpu_blocks,
            "num_unfinished_requests": len(self._requests),
        }

    # ---- invariants --------------------------------------------------------------------------------

    def assert_empty(self) -> None:
        """No request, block, stream or working KV left (call after a run has drained)."""
        assert not self._requests, f"{self.engine_id}: requests left: {list(self._requests)[:10]}"
        assert not self._streams, f"{self.engine_id}: streams left: {list(self._streams)[:10]}"
        self.scheduler.assert_empty()
        if self.runner:
            self.runner.assert_empty()
