"""An engine's record of itself: the counters of its report, and the recorder its events go to.

The engine calls `EngineStats.on_<event>`; each hook updates the counters the run's lag summary reads
and tells the recorder, which the composition root injects (`dashboards.recorders.EngineMetrics`).
Roles never import `dashboards`: the recorder is the `EngineRecorder` protocol, fed plain values and
`messages` types only (the scheduler's state as one `SchedulerStats`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Protocol

from actors.engine.health import EngineHealth
from actors.engine.request import Request, RequestStatus
from actors.engine.scheduling.scheduler import Scheduler
from emulation.kv_cache import NUM_NULL_BLOCKS
from messages import FinishedReason, RequestTimes
from messages.moe_steps import MoeStepLog
from messages.stats import NO_WORK, EngineCounters, EngineReport, SchedulerStats, StepWork


class EngineRecorder(Protocol):
    """Where an engine's events are recorded (Prometheus series in `dashboards.recorders`)."""

    def on_steps(
        self,
        step_s: Sequence[float],
        num_scheduled_tokens: Sequence[int],
        cpu_s: Sequence[float],
        work: StepWork,
    ) -> None:
        """Steps, their times, tokens, the CPU's share of each and their work on each GPU."""

    def on_state(self, stats: SchedulerStats) -> None:
        """The engine's state (at steps and on arrivals)."""

    def on_first_token(
        self,
        ttft_s: float,
        num_prompt_tokens: int,
        num_cached_tokens: int,
        num_external_tokens: Mapping[str, int],
    ) -> None:
        """`num_external_tokens`: the prompt tokens from outside the GPU prefix cache, by vLLM's cache
        hit source (`p2p`: a peer engine; `host`, `disk`: offload tiers)."""

    def on_next_tokens(self, itls_s: Sequence[float]) -> None:
        """Tokens after a request's first, each's gap from the one before."""

    def on_request_finished(
        self,
        reason: FinishedReason,
        times: RequestTimes,
        num_prompt_tokens: int,
        num_output_tokens: int,
        max_tokens: int,
        num_external_tokens: int,
    ) -> None: ...

    def on_kv_transfer_done(
        self, xfer_s: float, post_s: float, kv_bytes: int, num_blocks: int, state_bytes: int = 0
    ) -> None:
        """Decode side: a prompt's KV arrived (emulated transfer time and its fixed costs), and a hybrid
        target's SSM state of `state_bytes` with it."""

    def on_kv_transfer_failed(self) -> None: ...

    def on_kv_notification_failed(self) -> None: ...

    def on_kv_pull_back_failed(self) -> None:
        """Bidirectional: decode's blocks were gone; prefill recomputes them."""

    def on_kv_expired(self, num_requests: int) -> None: ...

    def on_kv_offload(self, op: str, tier: str, num_bytes: int, op_s: float) -> None:
        """A load (`op` load) from or a store (store) into the offload tier `tier`, of `op_s` emulated
        seconds from its start to its completion."""

    def on_kv_offload_tier(self, tier: str, usage: float, num_evicted: int, num_skipped: int) -> None:
        """An offload tier after a store: the share of its blocks in use, blocks it evicted and stores
        it skipped (no room) since its last report."""

    def on_kv_notification_after_expiry(self) -> None:
        """Source side: a peer's notice to free KV this engine no longer held (expired, or never)."""

    def on_admission_rejected(self, reason: str) -> None:
        """A request refused on arrival by a queue limit (`reason`: the limit's config field)."""

    def on_lag(self, what: str, max_overrun_s: float) -> None:
        """A step (`what`='step') or KV transfer ('kv_transfer') overran; the worst overrun so far."""


@dataclass
class EngineStats(EngineCounters):
    """Counters of an engine's life (its report); every `on_` hook also tells `recorder`."""

    recorder: EngineRecorder | None = field(default=None, kw_only=True)
    """None: nothing is recorded (a run whose metrics nobody reads, as a sweep's points)."""
    moe_target: bool = field(default=False, kw_only=True)
    """The target is a mixture of experts: its steps' work is logged (`report`'s `moe_steps`)."""
    kv_consumer: bool = field(default=False, kw_only=True)
    """The engine has a KV connector that loads KV (prefill and decode roles): its waiting requests'
    KV loads are counted by stage (`SchedulerStats.num_kv_fetch_reqs_by_stage`)."""
    _itls_s: list[float] = field(default_factory=list)
    """Inter-token gaps of the step under way, recorded with the step (one histogram update a step)."""
    _stamp_s: float | None = None
    _window_stamps_s: Sequence[float] = ()
    """The end of the step under way, if it emitted a token (its stamp); of a window's, those of its
    steps that emitted any (its last ones): when the steps ended, for the MoE step log."""
    _moe_log: MoeStepLog = field(default_factory=MoeStepLog)
    """A MoE target's steps over emulated time, for its report (empty for a dense target's)."""

    @property
    def reads_work(self) -> bool:
        """Whether `on_steps` reads its steps' `work` (their estimate costs a window's planning time)."""
        return self.recorder is not None or self.moe_target

    def report(self, role: str, sched: Scheduler, num_unfinished: int, health: EngineHealth) -> EngineReport:
        """An engine's report: a copy of these counters, the scheduler's state and the engine's health."""
        return EngineReport(
            role=role,
            counters=EngineCounters(**{f.name: getattr(self, f.name) for f in fields(EngineCounters)}),
            scheduler=scheduler_stats(sched, self.kv_consumer),
            num_gpu_blocks=sched.blocks.num_blocks + NUM_NULL_BLOCKS,
            num_unfinished_requests=num_unfinished,
            hung=health.hung_why,
            error=str(health.dead) if health.dead is not None else None,
            moe_steps=self._moe_log.snapshot() if self._moe_log.num_steps else None,
        )

    def on_step(
        self,
        step_s: float,
        num_tokens: int,
        overrun_s: float,
        cpu_s: float = 0.0,
        work: StepWork = NO_WORK,
        measured_s: float = 0.0,
    ) -> None:
        """`cpu_s`: of `step_s`, the CPU work on the step's path (the time model's overhead); `work`:
        the step's on each GPU; `measured_s`: of `step_s`, what measured kernels priced."""
        self.on_steps([step_s], [num_tokens], [cpu_s], work, [measured_s])
        if overrun_s > 0:
            self.num_lagged_steps += 1
            self._lag("step", overrun_s)

    def on_steps(
        self,
        step_s: Sequence[float],
        num_tokens: Sequence[int],
        cpu_s: Sequence[float],
        work: StepWork,
        measured_s: Sequence[float],
    ) -> None:
        """Steps on time (a window's), each of its `num_tokens`: their sums added one at a time, in
        order, as single steps add them."""
        self.num_steps += len(step_s)
        self.num_scheduled_tokens += sum(num_tokens)
        self.max_num_scheduled_tokens = max(self.max_num_scheduled_tokens, *num_tokens)
        for s, c, m in zip(step_s, cpu_s, measured_s, strict=True):
            self.busy_s += s
            self.cpu_s += c
            self.measured_s += m
        if work.moe is not None:  # a MoE target's: logged with the steps' ends (their tokens' stamps)
            stamps = self._window_stamps_s or ([] if self._stamp_s is None else [self._stamp_s])
            self._moe_log.add(step_s, stamps, work.moe)
        self._stamp_s, self._window_stamps_s = None, ()
        if self.recorder is None:
            return
        self.recorder.on_steps(step_s, num_tokens, cpu_s, work)
        if self._itls_s:
            self.recorder.on_next_tokens(self._itls_s)
            self._itls_s = []

    def on_state(self, sched: Scheduler) -> None:
        """The scheduler's and its block manager's state, for the gauges."""
        if self.recorder is not None:
            self.recorder.on_state(scheduler_stats(sched, self.kv_consumer))

    def on_token(self, req: Request, now_s: float) -> None:
        """A token of `req` was emitted at `now_s`: stamps it on `req.times` and records TTFT or ITL."""
        t = req.times
        if t.first_token_s is None:
            if self.recorder is not None:
                external = (
                    {"p2p": req.num_external_computed_tokens}
                    if req.is_remote_prefill
                    # vLLM names no source for a store shared across instances
                    else {
                        "host": t.offload_load.num_host_tokens,
                        "disk": t.offload_load.num_disk_tokens,
                        "external_unspecified": t.offload_load.num_shared_tokens,
                    }
                )
                self.recorder.on_first_token(
                    now_s - t.queued_s, req.num_prompt_tokens, t.num_cached_tokens, external
                )
            t.first_token_s = now_s
        elif t.last_token_s is not None and self.recorder is not None:
            self._itls_s.append(now_s - t.last_token_s)
        t.last_token_s = now_s
        self._stamp_s = now_s

    def on_window_tokens(self, emitted: list[tuple[Request, Sequence[float]]]) -> None:
        """`on_token` for each token a window's steps emitted (each request's stamps, in the batch's
        order), recorded in the order steps one at a time record them: step by step, the batch's order
        within a step, so that the recorder's sums add up to the same bits. Every request emits up to
        the window's last step; a first token (TTFT) is only ever a step's first one."""
        rows: list[tuple[int, float]] = []
        """(its number of stamps, the first one's gap) for each request with gaps, in the batch's order"""
        longest: Sequence[float] = []
        for req, stamps_s in emitted:
            t = req.times
            if t.first_token_s is None or t.last_token_s is None:
                self.on_token(req, stamps_s[0])
                stamps_s = stamps_s[1:]
            if stamps_s:
                last = t.last_token_s
                assert last is not None
                if self.recorder is not None:
                    rows.append((len(stamps_s), stamps_s[0] - last))
                    longest = max(longest, stamps_s, key=len)
                t.last_token_s = stamps_s[-1]
        if rows:
            self._itls_s += _step_major_gaps(rows, longest)
        self._window_stamps_s = max((stamps_s for _, stamps_s in emitted), key=len, default=())

    def on_request_rejected(self) -> None:
        self.num_rejected += 1

    def on_admission_rejected(self, reason: str) -> None:
        """Refused on arrival by the limit `reason` (`Refusal.limit`: vLLM's `max_num_queued_reqs` or
        `max_num_queued_tokens`, or the gateway's `max_waiting`)."""
        self.on_request_rejected()
        if self.recorder is not None:
            self.recorder.on_admission_rejected(reason)

    def on_request_finished(self, req: Request, reason: FinishedReason) -> None:
        if reason == "rejected":  # refused after queueing (scheduler.max_queue_time_s): never served
            self.on_request_rejected()
            return
        self.num_finished += 1
        if self.recorder is not None:
            self.recorder.on_request_finished(
                reason,
                req.times,
                req.num_prompt_tokens,
                len(req.output_token_ids),
                req.max_tokens,
                req.num_external_computed_tokens,
            )

    def on_kv_transfer_done(
        self,
        xfer_s: float,
        post_s: float,
        kv_bytes: int,
        num_blocks: int,
        overrun_s: float,
        state_bytes: int = 0,
    ) -> None:
        """`state_bytes`: a hybrid target's SSM state, moved beside the `kv_bytes` of KV."""
        self.num_transfers += 1
        if self.recorder is not None:
            self.recorder.on_kv_transfer_done(xfer_s, post_s, kv_bytes, num_blocks, state_bytes)
        if overrun_s > 0:
            self.num_lagged_transfers += 1
            self._lag("kv_transfer", overrun_s)

    def on_kv_transfer_failed(self, injected: bool = False) -> None:
        self.num_failed_loads += 1
        self.num_injected_load_failures += injected
        if self.recorder is not None:
            self.recorder.on_kv_transfer_failed()

    def on_kv_notification_failed(self) -> None:
        """The prefill side could not be told to release the KV (it died)."""
        if self.recorder is not None:
            self.recorder.on_kv_notification_failed()

    def on_kv_load_recomputed(self, pull_back: bool) -> None:
        """A failed load's request computes the KV here instead."""
        self.num_recomputed_loads += 1
        if pull_back and self.recorder is not None:
            self.recorder.on_kv_pull_back_failed()

    def on_kv_offload(self, op: str, tier: str, num_bytes: int, op_s: float) -> None:
        if self.recorder is not None:
            self.recorder.on_kv_offload(op, tier, num_bytes, op_s)

    def on_kv_offload_tier(self, tier: str, usage: float, num_evicted: int, num_skipped: int) -> None:
        if self.recorder is not None:
            self.recorder.on_kv_offload_tier(tier, usage, num_evicted, num_skipped)

    def on_kv_expired(self, num_requests: int) -> None:
        """Prefill side: `num_requests` held KV released unpulled (their decode died)."""
        self.num_expired_handoffs += num_requests
        if self.recorder is not None:
            self.recorder.on_kv_expired(num_requests)

    def on_kv_notification_after_expiry(self) -> None:
        if self.recorder is not None:
            self.recorder.on_kv_notification_after_expiry()

    def _lag(self, what: str, overrun_s: float) -> None:
        self.max_overrun_s = max(self.max_overrun_s, overrun_s)
        if self.recorder is not None:
            self.recorder.on_lag(what, self.max_overrun_s)


def scheduler_stats(sched: Scheduler, kv_consumer: bool = False) -> SchedulerStats:
    """A snapshot of the scheduler's and its block manager's state (`kv_consumer`: with its waiting
    requests' KV loads by stage)."""
    blocks = sched.blocks
    return SchedulerStats(
        num_running_reqs=len(sched.running),
        num_waiting_reqs=len(sched.waiting) + len(sched.recving),
        kv_cache_usage=blocks.usage,
        num_prefix_cache_queries=blocks.num_prefix_cache_queries,
        num_prefix_cache_hits=blocks.num_prefix_cache_hits,
        num_preemptions=sched.num_preemptions,
        num_kv_held_blocks=sum(len(r.block_ids) for r in sched.held.values()) if sched.held else 0,
        num_mm_cache_queries=sched.encoder_cache.num_queries,
        num_mm_cache_hits=sched.encoder_cache.num_hits,
        num_deferred_waiting_reqs=len(sched.recving),
        num_kv_fetch_reqs_by_stage=kv_fetch_stages(sched) if kv_consumer else (0, 0, 0),
    )


def kv_fetch_stages(sched: Scheduler) -> tuple[int, int, int]:
    """Waiting requests with a remote KV load in each of vLLM's stages (`KV_FETCH_STAGES`): waiting for
    blocks (from arrival), loading (from getting blocks until a step boundary notices the load done, as
    vLLM's worker reports finished loads at a step's end), and loaded but not yet scheduled. A load
    from the offload tiers counts from getting its blocks (its hit is known only then)."""
    to_start = loaded = 0
    for req in sched.waiting:  # preempted ones (status PREEMPTED) have left every stage, as in vLLM
        if req.status is not RequestStatus.WAITING:
            continue
        if req.remote_kv_loaded:  # (a peer's KV, or its offload tiers')
            loaded += 1
        elif req.is_remote_prefill:
            to_start += 1
    return to_start, len(sched.recving), loaded


def _step_major_gaps(rows: list[tuple[int, float]], ends_s: Sequence[float]) -> list[float]:
    """Every request's gaps, step by step, the batch's order within a step. A window's requests are
    stamped with its last steps' ends (`ends_s`: the longest's), so a gap after a request's first is
    its step's own, the same subtraction for each: computed once a step and repeated, and only the
    steps where requests start emitting are listed request by request::

        rows (3, g0) (2, g1)   ends e0 e1 e2:  step 0: g0 | step 1: e1-e0, g1 | step 2: e2-e1, e2-e1
    """
    num_steps = len(ends_s)
    step_gaps = [s - p for p, s in itertools.pairwise(ends_s)]  # step j's: step_gaps[j - 1]
    starts = sorted({num_steps - n for n, _ in rows})
    out: list[float] = []
    for a, b in itertools.pairwise([*starts, num_steps]):
        at_a = [
            (first if num_steps - n == a else step_gaps[a - 1]) for n, first in rows if num_steps - n <= a
        ]
        out += at_a  # step a, where requests start
        out += itertools.chain.from_iterable(
            map(itertools.repeat, step_gaps[a : b - 1], itertools.repeat(len(at_a)))
        )
    return out
