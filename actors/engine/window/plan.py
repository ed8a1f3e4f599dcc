"""Windows: many steps emulated as one event (virtual mode, compute skip).

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
    cut short:      an entry point (new request, abort, push notice) or a timer set for before
                    start_k closes the window after the steps begun by then.

Nothing may see the engine's state between T and start_k that a step at a time would have shown it:
the engine's own known events (requests queued for later, KV loads and expiries) bound k when
planning; an entry point (a new request, an abort, a push notice) ends the window at once; its
clients read only stamps, and get each request's tokens at its end; and a KV router in process ends
the window after the steps begun by now before it reads the engine's events (`Router.before_read`),
so it sees what it would have seen a step at a time. Its counters and metrics are recorded in the
order steps one at a time record them, so they add up to the same bits.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import operator
from dataclasses import dataclass, field

from actors.engine.kv_cache.coordinator import KVCacheCoordinator
from actors.engine.request import Request, RequestStatus
from actors.engine.scheduling.scheduled_batch import ScheduledBatch
from actors.engine.scheduling.scheduler import Scheduler, stop_reason
from emulation.step_shape import StepShape, decode_step, decode_steps
from emulation.time_model import StepTimeModel, TimedStep
from messages import FinishedReason
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
    num_steps = min(num_steps, _steps_with_blocks(batch.requests, [], sched.blocks, num_steps))
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
    chunks: list[int] = []
    left = chunked.num_tokens - chunked.num_computed_tokens
    while left > 0 and not (chunks and left == 1):  # one token left: scheduled as a decode, in order
        chunks.append(min(left, budget, sched.max_num_new_tokens))
        left -= chunks[-1]
    if sched.head_of_line(start) is not None:
        # A request waits: a step that leaves budget would admit it, so the window ends before one.
        chunks = list(itertools.takewhile(lambda n: n == budget, chunks))
    num_steps = min([len(chunks), *(_steps_to_finish(r) for r in decodes)])
    if num_steps <= 1 or chunks[0] != batch.num_new_tokens[-1]:
        return None
    num_steps = min(num_steps, _steps_with_blocks(batch.requests, chunks, sched.blocks, num_steps))
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


def steady(batch: ScheduledBatch, sched: Scheduler, start: float) -> bool:
    """Every running request is in the batch, each decoding one token but the last, which may compute
    a prompt chunk, all with forced answers (compute skip); nothing else happens this step, and no
    waiting request is visible yet, or (beside a prompt chunk) one only the token budget holds back."""
    if (
        batch.preempted
        or batch.new_remote_requests
        or batch.new_offload_loads
        or batch.pull_backs_taking_nothing
    ):
        return False
    if batch.encoder_inputs or len(batch.requests) != len(sched.running):
        return False
    *decodes, last = batch.num_new_tokens
    head = sched.head_of_line(start)
    if head is not None and (last == 1 or sched.takes_blocks_first(head)):
        return False
    if any(n != 1 for n in decodes):
        return False
    if last == 1 and batch.shape.num_logits != batch.shape.num_new_tokens:
        return False
    if last > 1 and batch.requests[-1].mm_items:  # its chunks would stop at images to encode
        return False
    if not sched.blocks.steady(batch.requests, chunked=last > 1):
        return False  # a kind of KV changes its blocks otherwise (a hybrid's aligned chunks, states)
    return all(r.forced_output_token_ids is not None for r in batch.requests)


def _steps_to_finish(req: Request) -> int:
    """Steps until `req` stops, its last token's step included (forced answers only)."""
    forced = req.forced_output_token_ids
    assert forced is not None
    return min(req.max_tokens, len(forced)) - len(req.output_token_ids)


def _new_blocks(
    requests: list[Request], chunks: list[int], block_size: int, num_steps: int
) -> list[tuple[int, int, int]]:
    """The blocks the steps after the first allocate, as runs in the order a step at a time allocates
    them (step by step, then the batch's order): (step, request index, block count). A decode takes one
    at its first step and every `block_size` steps after; the chunked request one run a step, what its
    chunk reaches past the blocks it holds (hundreds of blocks: listed as one)."""
    firsts = _first_new_blocks(requests, chunks, block_size)
    if not chunks and all(f <= block_size for f in firsts):
        # Decodes only, each starting within the first `block_size` steps: every round of that many
        # steps allocates in the same order (by first step, then the batch's), the last one cut short.
        order = sorted(range(len(firsts)), key=lambda r: (firsts[r], r))
        out = []
        for base in range(0, num_steps, block_size):
            out += [(base + firsts[r], r, 1) for r in order if base + firsts[r] < num_steps]
        return out
    out = [(i, r, 1) for r, first in enumerate(firsts) for i in range(first, num_steps, block_size)]
    if chunks:
        steps, sizes = _chunk_new_blocks(requests[-1], chunks, block_size, num_steps)
        out += [(i, len(requests) - 1, n) for i, n in zip(steps, sizes, strict=True)]
    return sorted(out)  # (step, request) pairs are distinct: counts are never compared


def _first_new_blocks(requests: list[Request], chunks: list[int], block_size: int) -> list[int]:
    """Each decode's first step (after the first) that needs a new block: step i (0-based) computes
    token position num_computed + i, which needs one once it lies past the blocks held; then every
    `block_size` steps."""
    decodes = requests[:-1] if chunks else requests
    return [max(1, len(req.block_ids) * block_size - req.num_computed_tokens) for req in decodes]


def _chunk_new_blocks(
    req: Request, chunks: list[int], block_size: int, num_steps: int
) -> tuple[list[int], list[int]]:
    """The steps (after the first) at which the chunked request needs blocks, and how many: what its
    chunk reaches past the blocks it holds."""
    steps, sizes = [], []
    held, computed = len(req.block_ids), req.num_computed_tokens + chunks[0]
    for i in range(1, num_steps):
        computed += chunks[i]
        need = -(-computed // block_size) - held
        if need > 0:
            steps.append(i)
            sizes.append(need)
            held += need
    return steps, sizes


def _steps_with_blocks(
    requests: list[Request], chunks: list[int], blocks: KVCacheCoordinator, num_steps: int
) -> int:
    """How many of the steps the free blocks last for (a step short of blocks would preempt): each new
    block of tokens takes a block of every kind (`num_blocks_per_position`); blocks a sliding window
    frees meanwhile are not counted, so a window may end before blocks would run short."""
    bs, per_position = blocks.block_size, blocks.num_blocks_per_position
    num_needed = sum(len(range(first, num_steps, bs)) for first in _first_new_blocks(requests, chunks, bs))
    if chunks:
        num_needed += sum(_chunk_new_blocks(requests[-1], chunks, bs, num_steps)[1])
    if num_needed * per_position <= blocks.num_free_blocks:  # counted, not listed: the usual case
        return num_steps
    runs = _new_blocks(requests, chunks, bs, num_steps)
    counts = list(itertools.accumulate(n * per_position for _, _, n in runs))
    return runs[bisect.bisect_right(counts, blocks.num_free_blocks)][0]  # it misses a block: not run


def _allocate_each(
    sched: Scheduler, requests: list[Request], chunks: list[int], steps: list[tuple[int, int]]
) -> None:
    """The allocations of the window's `steps` ((step, request index), in the order a step at a time
    makes them), each as that step's scheduler made it: with the tokens computed before the step."""
    for i, r in steps:
        req = requests[r]
        computed = req.num_computed_tokens
        chunked = bool(chunks) and r == len(requests) - 1
        req.num_computed_tokens = computed + (sum(chunks[:i]) if chunked else i)
        sched.blocks.allocate_step(req, chunks[i] if chunked else 1)  # (they fit: `_steps_with_blocks`)
        req.num_computed_tokens = computed


def commit(
    window: Window, sched: Scheduler
) -> list[tuple[Request, list[int], list[float], FinishedReason | None]]:
    """Apply the window's steps to its requests, as `Scheduler.update_from_output` applies one step
    at a time: blocks, computed tokens, compute time, tokens out; each request with its new tokens,
    their stamps and the reason it now stops (None: it goes on)."""
    assert not window.committed
    window.committed = True
    k, requests, chunks = window.num_steps, window.batch.requests, window.chunks
    runs = _new_blocks(requests, chunks, sched.blocks.block_size, k)
    events = sched.blocks.window_events(requests, chunks, k)
    if events:  # a kind of KV frees blocks as it goes: every step that changes blocks, in order
        _allocate_each(sched, requests, chunks, sorted(events.union((i, r) for i, r, _ in runs)))
    else:  # new blocks only, taken at once (no block is freed between)
        sched.blocks.append_block_runs([(requests[r], n) for _, r, n in runs])
    out = []
    for i, req in enumerate(requests):
        assert req.status is RequestStatus.RUNNING, "a window's requests run to its end"
        if req.times.first_scheduled_s is None:
            req.times.first_scheduled_s = window.starts[0]
        chunked = bool(chunks) and i == len(requests) - 1
        req.num_computed_tokens += sum(chunks[:k]) if chunked else k
        req.compute_s = functools.reduce(operator.add, window.step_s[:k], req.compute_s)  # one at a time
        forced = req.forced_output_token_ids
        assert forced is not None
        n = len(req.output_token_ids)
        num_out = (1 if req.num_computed_tokens >= req.num_tokens else 0) if chunked else k
        tokens = list(forced[n : n + num_out])
        req.output_token_ids += tokens
        sched.blocks.cache_blocks(req, req.num_computed_tokens)
        if tokens:
            stamps = window.ends[k - len(tokens) : k]
            out.append((req, tokens, stamps, stop_reason(req, tokens[-1])))
    return out
