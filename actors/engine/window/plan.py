"""Windows: many steps emulated as one event (virtual mode, compute skip). What the steps do is the
scheduler's to say (`Scheduler.steady`, `prompt_chunks`, `update_from_steps`) and the KV cache's
(`num_steps_with_blocks`, `allocate_steps`); a window adds their times.

When a step's batch is every running request, each decoding one token but perhaps the last, which
computes a prompt chunk, and nothing can change that batch for the next k steps (no request finishes
before step k, none becomes visible, no block runs short, no known event of the engine is due), those k
steps differ only in the KV each decode reads and the chunk each computes (what the decodes leave of
the token budget, up to the step that completes the prompt). The engine then plans them at once: the
time model evaluates the k step shapes (decode-only: as arrays, `step_shape.decode_steps`), each
step's end is the previous end plus its time (the same additions a step at a time makes, so every
stamp is bit for bit the same), and the window's state is committed in bulk when it closes::

    planned at T:   T ──── step 1 ──── step 2 ──── ... ──── step k ──── end_k
    engine wakes:                                           ^ start_k: commits steps 1..k (tokens
                                                              out, stamped end_1..end_k), sleeps
                                                              until end_k as after any step
    cut short:      a change from outside (new request, abort, push notice: each wakes the step
                    loop first) or a timer set for before start_k closes the window after the steps
                    begun by then.

Nothing may see the engine's state between T and start_k that a step at a time would have shown it:
the engine's own known events (requests queued for later, KV loads and expiries) bound k when
planning; a change from outside wakes the step loop first, which ends the window at once; its
clients read only stamps, and get each request's tokens at its end; and a KV router in process ends
the window after the steps begun by now before it reads the engine's events (`Router.before_read`),
so it sees what it would have seen a step at a time. Its counters and metrics are recorded in the
order steps one at a time record them, so they add up to the same bits.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field

from actors.engine.request import Request
from actors.engine.scheduling.scheduled_batch import ScheduledBatch
from actors.engine.scheduling.scheduler import Scheduler
from emulation.step_shape import StepShape, decode_step, decode_steps
from emulation.time_model import StepTimeModel, TimedStep
from messages.stats import StepWork


@dataclass
class Window:
    """Steps planned at once; `num_steps` shrinks when the window is cut short."""

    batch: ScheduledBatch
    starts: list[float]
    ends: list[float]
    step_s: list[float]
    """Each step's emulated time (what its end adds)."""
    cpu_s: list[float]
    """Of `step_s`, the CPU's (the time model's overhead)."""
    measured_s: list[float]
    """Of `step_s`, what kernels measured on silicon priced (the time model's `measured_s`)."""
    num_steps: int
    chunks: list[int] = field(default_factory=list)
    """The prompt chunk the batch's last request computes at each step (none: decodes only)."""
    timed: TimedStep | list[TimedStep] | None = None
    """The time model's figures of its steps: of all at once (decodes), or of each (a chunk beside)."""
    committed: bool = False

    def cut_before(self, sim_t: float) -> None:
        """Keep only the steps that start before `sim_t` (the first one always: it is under way)."""
        self.num_steps = max(1, min(self.num_steps, bisect.bisect_left(self.starts, sim_t)))

    def work(self) -> StepWork:
        """Its steps' work on each GPU, as the time model estimates it (read only where recorded: a
        MoE target's step log, the metrics)."""
        t = self.timed
        assert t is not None
        work = StepWork.of_each(t) if isinstance(t, list) else StepWork.of(t, len(self.ends))
        return work.first(self.num_steps)

    @property
    def last_start(self) -> float:
        return self.starts[self.num_steps - 1]

    @property
    def end(self) -> float:
        return self.ends[self.num_steps - 1]

    @property
    def num_scheduled_tokens(self) -> list[int]:
        """Each step's tokens: one a decode, and the chunk's."""
        num_decodes = len(self.batch.requests) - bool(self.chunks)
        return [num_decodes + n for n in self.chunks[: self.num_steps] or [0] * self.num_steps]


def plan_window(
    batch: ScheduledBatch,
    sched: Scheduler,
    time_model: StepTimeModel,
    start: float,
    horizon: float,
) -> Window | None:
    """The window of steps starting with `batch` at `start` (a `steady` one), up to (not at) `horizon`
    (the first other event that could change it), or None when it would be a single step."""
    if batch.num_new_tokens[-1] > 1:
        return _plan_chunks(batch, sched, time_model, start, horizon)
    num_steps = min(_steps_to_finish(r) for r in batch.requests)
    if num_steps <= 1:
        return None
    if horizon < math.inf:  # steps only grow (each reads more KV): no more than this many start before it
        first_s = time_model.step_time_of(batch.shape).total_s
        num_steps = min(num_steps, math.floor((horizon - start) / first_s) + 1)
        if num_steps <= 1:
            return None
    num_steps = min(num_steps, sched.blocks.num_steps_with_blocks(batch.requests, [], num_steps))
    times = time_model.step_time_of(decode_steps(batch.shape, num_steps))
    step_s = times.total_s.tolist()  # type: ignore[attr-defined]  # an array: decode_steps's
    cpu_s, measured_s = (
        v.tolist() if hasattr(v, "tolist") else [v] * num_steps for v in (times.overhead_s, times.measured_s)
    )
    ends = list(itertools.accumulate(step_s, initial=start))  # end_i = end_(i-1) + t_i, as steps do
    window = Window(batch, ends[:-1], ends[1:], step_s, cpu_s, measured_s, num_steps, timed=times)
    window.cut_before(horizon)
    return window if window.num_steps > 1 else None


def _plan_chunks(
    batch: ScheduledBatch, sched: Scheduler, time_model: StepTimeModel, start: float, horizon: float
) -> Window | None:
    """A window whose batch's last request computes its prompt in chunks beside the decodes: each step
    gives it what the decodes leave of the token budget, up to the step that completes its prompt
    (after which it decodes too, or ends). Step times one step at a time (the chunks differ)."""
    *decodes, chunked = batch.requests
    budget = sched.max_num_batched_tokens - len(decodes)
    chunks = sched.prompt_chunks(chunked, budget)
    if sched.head_of_line(start) is not None:
        # A request waits: a step that leaves budget would admit it, so the window ends before one.
        chunks = list(itertools.takewhile(lambda n: n == budget, chunks))
    num_steps = min([len(chunks), *(_steps_to_finish(r) for r in decodes)])
    if num_steps <= 1 or chunks[0] != batch.num_new_tokens[-1]:
        return None
    num_steps = min(num_steps, sched.blocks.num_steps_with_blocks(batch.requests, chunks, num_steps))
    decoding = StepShape()
    for req in decodes:
        decoding.add(1, req.num_computed_tokens, True)
    starts, step_s, cpu_s, measured_s, times = [start], [], [], [], []
    computed = chunked.num_computed_tokens
    for i in range(num_steps):
        if i > 0 and starts[-1] >= horizon:
            starts.pop()
            break
        shape = batch.shape
        if i > 0:
            shape = decode_step(decoding, i)
            shape.add(chunks[i], computed, computed + chunks[i] == chunked.num_tokens)
        computed += chunks[i]
        t = time_model.step_time_of(shape)
        times.append(t)
        step_s.append(t.total_s)
        cpu_s.append(t.overhead_s)
        measured_s.append(t.measured_s)
        starts.append(starts[-1] + t.total_s)  # end_i = end_(i-1) + t_i, as steps do
    ends = starts[1:]
    if len(ends) <= 1:
        return None
    return Window(batch, starts[:-1], ends, step_s, cpu_s, measured_s, len(ends), chunks, times)


def _steps_to_finish(req: Request) -> int:
    """Steps until `req` stops, its last token's step included (forced answers only)."""
    forced = req.forced_output_token_ids
    assert forced is not None
    return min(req.max_tokens, len(forced)) - len(req.output_token_ids)
