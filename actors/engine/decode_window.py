"""Decode windows: many decode-only steps emulated as one event (virtual mode, compute skip).

When a step's batch is every running request decoding one token, and nothing can change that batch
for the next k steps (no request finishes before step k, no block runs short, no request becomes
visible, no other event of the run is due), those k steps differ only in the KV each decode reads.
The engine then plans them at once: the time model evaluates the k step shapes as arrays
(`step_shape.decode_steps`), each step's end is the previous end plus its time (the same additions a
step at a time makes, so every stamp is bit for bit the same), and the window's state is committed
in bulk when it closes::

    planned at T:   T ──── step 1 ──── step 2 ──── ... ──── step k ──── end_k
    engine wakes:                                           ^ start_k: commits steps 1..k (tokens
                                                              out, stamped end_1..end_k), sleeps
                                                              until end_k as after any step
    cut short:      an entry point (new request, abort, push notice) or a timer set for before
                    start_k closes the window after the steps begun by then.

Nothing may see the engine's state between T and start_k that a step at a time would have shown it:
the engine's own known events (requests queued for later, KV loads and expiries) bound k when
planning; an entry point (a new request, an abort, a push notice) ends the window at once; its
clients read only stamps, and get each request's tokens at its end; and when a KV router reads the
engine's events as they come, every other timer of the run bounds k too (`Clock.horizon_s` when
planning, `Clock.watch_timers` while the window is open).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from actors.engine.block_manager import BlockManager
from actors.engine.clock import Clock
from actors.engine.request import Request, RequestStatus
from actors.engine.scheduler import ScheduledBatch, Scheduler, stop_reason
from actors.engine.stats import EngineStats
from actors.engine.step_clock import StepClock
from actors.engine.streams import OutputStreams
from messages import FinishedReason
from target.step_shape import decode_steps
from target.time_model import StepTimeModel


@dataclass
class DecodeWindow:
    """Steps planned at once; `num_steps` shrinks when the window is cut short."""

    batch: ScheduledBatch
    starts: list[float]
    ends: list[float]
    step_s: list[float]
    """Each step's emulated time (what its end adds)."""
    cpu_s: list[float]
    """Of `step_s`, the CPU's (the time model's overhead)."""
    num_steps: int
    committed: bool = False

    def cut_before(self, sim_t: float) -> None:
        """Keep only the steps that start before `sim_t` (the first one always: it is under way)."""
        self.num_steps = max(1, min(self.num_steps, sum(1 for s in self.starts if s < sim_t)))

    @property
    def last_start(self) -> float:
        return self.starts[self.num_steps - 1]

    @property
    def end(self) -> float:
        return self.ends[self.num_steps - 1]


def plan_window(
    batch: ScheduledBatch,
    sched: Scheduler,
    time_model: StepTimeModel,
    start: float,
    horizon: float,
) -> DecodeWindow | None:
    """The window of decode-only steps starting with `batch` at `start`, up to (not at) `horizon`
    (the first other event that could change it), or None when it would be a single step."""
    if not _decode_only(batch, sched, start):
        return None
    num_steps = min(_steps_to_finish(r) for r in batch.requests)
    if num_steps <= 1:
        return None
    if horizon < math.inf:  # steps only grow (each reads more KV): no more than this many start before it
        first_s = time_model.step_time_of(batch.shape).total_s
        num_steps = min(num_steps, math.floor((horizon - start) / first_s) + 1)
        if num_steps <= 1:
            return None
    num_steps = min(num_steps, _steps_with_blocks(batch.requests, sched.blocks, num_steps))
    times = time_model.step_time_of(decode_steps(batch.shape, num_steps))
    step_s = times.total_s.tolist()  # type: ignore[attr-defined]  # an array: decode_steps's
    cpu = times.overhead_s
    cpu_s = cpu.tolist() if hasattr(cpu, "tolist") else [cpu] * num_steps
    ends = list(itertools.accumulate(step_s, initial=start))  # end_i = end_(i-1) + t_i, as steps do
    window = DecodeWindow(batch, ends[:-1], ends[1:], step_s, cpu_s, num_steps)
    window.cut_before(horizon)
    return window if window.num_steps > 1 else None


def _decode_only(batch: ScheduledBatch, sched: Scheduler, start: float) -> bool:
    """Every running request decodes one token, with a forced answer (compute skip), nothing else
    happens this step, and no waiting request is visible yet."""
    if batch.preempted or batch.new_remote_requests or batch.pull_backs_taking_nothing:
        return False
    if batch.encoder_inputs or len(batch.requests) != len(sched.running):
        return False
    if sched.waiting and sched.waiting[0].times.queued_s <= start:
        return False
    shape = batch.shape
    if shape.num_decodes != shape.num_new_tokens or shape.num_logits != shape.num_new_tokens:
        return False
    return all(r.forced_output_token_ids is not None for r in batch.requests)


def _steps_to_finish(req: Request) -> int:
    """Steps until `req` stops, its last token's step included (forced answers only)."""
    forced = req.forced_output_token_ids
    assert forced is not None
    return min(req.max_tokens, len(forced)) - len(req.output_token_ids)


def _new_blocks(requests: list[Request], block_size: int, num_steps: int) -> list[tuple[int, int]]:
    """(step, request index) of each block the steps after the first allocate, in the order a step at
    a time allocates them: step by step, then the batch's order. Step i (0-based) computes token
    position num_computed + i, which needs a new block once it lies past the blocks held."""
    out = []
    for r, req in enumerate(requests):
        first = max(1, len(req.block_ids) * block_size - req.num_computed_tokens)
        out += [(i, r) for i in range(first, num_steps, block_size)]
    return sorted(out)


def _steps_with_blocks(requests: list[Request], blocks: BlockManager, num_steps: int) -> int:
    """How many of the steps the free blocks last for (a step short of blocks would preempt)."""
    needed = _new_blocks(requests, blocks.block_size, num_steps)
    if len(needed) <= blocks.num_free_blocks:
        return num_steps
    return needed[blocks.num_free_blocks][0]  # the step whose block is missing does not run


def commit(window: DecodeWindow, sched: Scheduler) -> list[tuple[Request, list[int], FinishedReason | None]]:
    """Apply the window's steps to its requests, as `Scheduler.update_from_output` applies one step
    at a time: blocks, computed tokens, compute time, tokens out; each request with its new tokens
    (stamped `window.ends`) and the reason it now stops (None: it goes on)."""
    assert not window.committed
    window.committed = True
    k, requests = window.num_steps, window.batch.requests
    for _, r in itertools.takewhile(lambda e: e[0] < k, _new_blocks(requests, sched.blocks.block_size, k)):
        sched.blocks.append_blocks(requests[r], 1)
    out = []
    for req in requests:
        assert req.status is RequestStatus.RUNNING, "a window's requests run to its end"
        if req.times.first_scheduled_s is None:
            req.times.first_scheduled_s = window.starts[0]
        req.num_computed_tokens += k
        for t in window.step_s[:k]:
            req.compute_s += t
        forced = req.forced_output_token_ids
        assert forced is not None
        tokens = list(forced[len(req.output_token_ids) : len(req.output_token_ids) + k])
        req.output_token_ids += tokens
        sched.blocks.cache_full_blocks(req)
        out.append((req, tokens, stop_reason(req, tokens[-1])))
    return out


class DecodeWindows:
    """An engine's decode windows: planning one, running it, ending it early. Its collaborators are
    the engine's; `finish` ends a request as the engine does."""

    def __init__(
        self,
        clock: Clock,
        step_clock: StepClock,
        scheduler: Scheduler,
        time_model: StepTimeModel,
        stats: EngineStats,
        streams: OutputStreams,
        finish: Callable[[Request, FinishedReason, float], None],
        enabled: bool = True,
    ) -> None:
        """`enabled`: plan windows at all (virtual clock, compute skip, `runner.macro_steps`)."""
        self.enabled = enabled
        self.clock, self.step_clock, self.scheduler = clock, step_clock, scheduler
        self.time_model, self.stats, self.streams, self.finish = time_model, stats, streams, finish
        self._window: DecodeWindow | None = None
        """The window under way, until its steps are committed."""

    def plan(
        self, batch: ScheduledBatch, start: float, upcoming: Callable[[float], list[float]]
    ) -> DecodeWindow | None:
        """The window starting with `batch` at `start`, before the engine's `upcoming(start)` events
        and, when a KV router reads the engine's events as they come, every other event of the run."""
        if not self.enabled:
            return None
        observed = self.scheduler.blocks.publishes_kv_events
        horizon = min([self.clock.horizon_s() if observed else math.inf, *upcoming(start)])
        return plan_window(batch, self.scheduler, self.time_model, start, horizon)

    async def run(self, window: DecodeWindow) -> float:
        """Sleep to the window's last step (unless it is cut short), commit its steps, sleep to their
        end; the end."""
        self._window = window

        def on_timer(sim_t: float) -> None:  # another event of the run is due: the window ends before it
            last = window.last_start
            window.cut_before(sim_t)
            if window.last_start != last:
                self.step_clock.interrupt()

        watch = on_timer if self.scheduler.blocks.publishes_kv_events else None
        while not window.committed:
            if await self.step_clock.nap(window.last_start, watch):
                self._commit(window)
        self._window = None
        await self.clock.sleep_until(window.end)
        k = window.num_steps
        self.stats.on_steps(window.step_s[:k], window.batch.num_scheduled_tokens, window.cpu_s[:k])
        self.stats.on_state(self.scheduler)
        return window.end

    def settle(self) -> None:
        """End the window under way with the steps begun by now (a step at a time, a change from
        outside would reach the next step)."""
        window = self._window
        if window is not None and not window.committed:
            window.cut_before(math.nextafter(self.clock.now(), math.inf))
            self._commit(window)
            self.step_clock.interrupt()

    def _commit(self, window: DecodeWindow) -> None:
        stamps = window.ends[: window.num_steps]
        for req, tokens, stop in commit(window, self.scheduler):
            self.stats.on_tokens(req, stamps)
            self.streams.push_many(req.request_id, tokens, stamps)
            if stop is not None:
                self.finish(req, stop, window.end)
