"""A role -> its recorder and the run's summary: snapshots of an engine's scheduler (vLLM's
`SchedulerStats`, flattened) and of an encoder, taken at steps and on arrivals; and an engine's report
of its whole life (`EngineReport`), once drained. The counts are totals since the role started.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from messages.moe_steps import MoeSteps, MoeWork, per_step

if TYPE_CHECKING:  # (the time models' results; imported for their type only)
    from emulation.time_model import TimedStep

KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")
"""vLLM's stages of a waiting request's KV load (`SchedulerStats.num_kv_fetch_reqs_by_stage`): it has no
blocks yet; its KV is moving (or moved, not yet noticed at a step boundary); it arrived and the request
waits for its first step."""


@dataclass(frozen=True)
class SchedulerStats:
    num_running_reqs: int
    num_waiting_reqs: int
    """Waiting to be scheduled, or for their KV to arrive."""
    kv_cache_usage: float
    """The share of the KV cache's blocks in use (0 to 1)."""
    num_prefix_cache_queries: int
    num_prefix_cache_hits: int
    num_preemptions: int
    num_kv_held_blocks: int
    """Blocks of finished requests held for a pull: prefill side, until decode's notice; decode side
    (bidirectional), for the conversation's next turn."""
    num_mm_cache_queries: int = 0
    num_mm_cache_hits: int = 0
    """The encoder cache's lookups of images, and its hits."""
    num_deferred_waiting_reqs: int = 0
    """Of `num_waiting_reqs`, those waiting for their remote KV to arrive (vLLM's deferred ones,
    `num_skipped_waiting_reqs`); the rest wait for scheduling capacity."""
    num_kv_fetch_reqs_by_stage: tuple[int, int, int] = (0, 0, 0)
    """Waiting requests with a remote KV load, in each of `KV_FETCH_STAGES` (engines with a KV
    connector: prefill and decode)."""


@dataclass(frozen=True)
class StepWork:
    """Steps' work on each GPU of the engine, as its time model estimates it (vLLM's `PerfStats`):
    one value a step, in the steps' order."""

    flops: Sequence[float] = ()
    read_bytes: Sequence[float] = ()
    write_bytes: Sequence[float] = ()
    moe: MoeWork | None = None
    """A MoE target's steps: their expert load and all-to-alls (None: a dense target's)."""

    @classmethod
    def of(cls, step: TimedStep, num_steps: int = 1) -> StepWork:
        """The work of `num_steps` steps timed at once (each figure an array of them, or one value
        every step shares), or of one step."""
        flops, read, written = (
            per_step(v, num_steps)
            for v in (step.flops_per_gpu, step.read_bytes_per_gpu, step.write_bytes_per_gpu)
        )
        return cls(flops, read, written, MoeWork.of(step, num_steps))

    @classmethod
    def of_each(cls, steps: Sequence[TimedStep]) -> StepWork:
        return cls(
            [s.flops_per_gpu for s in steps],
            [s.read_bytes_per_gpu for s in steps],
            [s.write_bytes_per_gpu for s in steps],
            MoeWork.of_each(steps),
        )

    def first(self, num_steps: int) -> StepWork:
        moe = self.moe.first(num_steps) if self.moe is not None else None
        return StepWork(
            self.flops[:num_steps], self.read_bytes[:num_steps], self.write_bytes[:num_steps], moe
        )


NO_WORK = StepWork()
"""Steps whose work is not estimated."""


@dataclass(frozen=True)
class EncoderStats:
    """An encoder's totals: its recorder's counters and the run's encoder summary read these values."""

    num_steps: int
    busy_s: float
    """Emulated seconds spent in steps."""
    num_mm_cache_queries: int
    num_mm_cache_hits: int


@dataclass
class EngineCounters:
    """An engine's counters since it started: its `EngineStats` hooks add to them; its report copies them."""

    num_steps: int = 0
    num_scheduled_tokens: int = 0
    max_num_scheduled_tokens: int = 0
    busy_s: float = 0.0
    """Emulated seconds spent in steps."""
    cpu_s: float = 0.0
    """Of `busy_s`, the CPU work on the steps' path."""
    measured_s: float = 0.0
    """Of `busy_s`, what kernels measured on silicon priced (`target.time_model: measured`)."""
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
    num_rejected: int = 0
    """Requests refused by an admission limit (`scheduler.max_num_queued_reqs`, `max_num_queued_tokens`,
    `max_waiting`) or run out of `max_queue_time_s`."""
    num_failed_loads: int = 0
    """KV loads into this engine that failed (pull backs and injected failures among them)."""
    num_injected_load_failures: int = 0
    """Of those, failed on purpose (`faults`)."""
    num_recomputed_loads: int = 0
    """Failed loads whose request computed the KV here instead (pull backs; P/D with
    kv_transfer.load_failure_policy=recompute)."""


@dataclass(frozen=True)
class EngineReport:
    """engine -> composition root (on drain, or asked): its life so far, for engines.json and the run's
    lag and fault summaries."""

    role: str
    counters: EngineCounters
    """A copy: the engine's own keep counting."""
    scheduler: SchedulerStats
    """Its scheduler's state when asked (preemptions and prefix-cache totals among them)."""
    num_gpu_blocks: int
    """KV blocks as vLLM counts them: the null block among them (`emulation.kv_cache`)."""
    num_unfinished_requests: int
    """Requests still in the engine (0 once drained)."""
    hung: str | None = None
    """Why the engine takes no more steps, if it hung (`faults.engine_hangs`)."""
    error: str | None = None
    """Why its step loop broke (killed on purpose or crashed), if it did."""
    moe_steps: MoeSteps | None = None
    """A MoE target's steps over emulated time: expert load, imbalance, all-to-alls (None: dense)."""


@dataclass(frozen=True)
class LostEngine:
    """An engine that could not report: its actor was gone or silent when the run drained."""

    error: str
