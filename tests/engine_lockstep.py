"""The testbed's engine stepped in lockstep with another: one `EngineCore` on a virtual loop, every step
one emulated second, so step k starts at second k and a request arriving at step k is queued at k.

What `run_engine` gives, per scenario (the format of `vllm_peer_scripts/step_engine.py`):
  - one record per step that scheduled or preempted, the shape `step_scheduler.py` gives (scheduled tokens
    per request, preemptions in order, finished, free blocks after the step, admitted with its hit);
  - each request's outcome: tokens, the step that emitted each (a token's stamp is its step's end),
    finished reason, prefix hit and preemptions.
With macro steps on, a window of steps runs as one `schedule` call: records then cover only the steps
that called it (`EngineRun.num_schedules` counts them); outcomes still cover every token.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from actors.engine.clock import Clock, VirtualTimeLoop
from actors.engine.core import EngineCore
from actors.engine.scheduling.scheduled_batch import ScheduledBatch
from actors.engine.scheduling.scheduler import Scheduler
from cluster.config_load import build_config
from cluster.engines import build_engine, runner_for
from emulation.config import TestbedConfig
from emulation.step_shape import StepShape
from messages import EngineRequest, FinishedReason

Scenario = dict[str, Any]
Record = dict[str, Any]


@dataclass(frozen=True)
class StepTime:
    """A step's time (`TimedStep`): one second, no CPU share, no work counted, a dense target's."""

    total_s: Any
    overhead_s: Any
    flops_per_gpu: Any = 0.0
    read_bytes_per_gpu: Any = 0.0
    write_bytes_per_gpu: Any = 0.0
    all_to_all_s: Any = 0.0
    overlap_s: Any = 0.0
    measured_s: Any = 0.0
    expert_load: None = None


class OneSecondSteps:
    """A step-time model where every step takes one emulated second (a window's steps: an array of
    ones), so a step's start is its index and a token's stamp its step's index plus one."""

    def step_time_of(self, shape: StepShape) -> StepTime:
        grown = shape.num_context_tokens  # an array for a window's decode steps (`decode_steps`)
        if isinstance(grown, np.ndarray):
            zeros = np.zeros(grown.shape)
            return StepTime(np.ones(grown.shape), zeros, zeros, zeros, zeros)
        return StepTime(1.0, 0.0)


@dataclass
class Outcome:
    """One request's result as its client saw it."""

    token_ids: list[int]
    token_steps: list[int]
    """The step that emitted each token (its stamp less one second)."""
    finished_reason: FinishedReason | None = None
    finished_step: int = -1
    num_cached_tokens: int = 0
    """Its prefix hit when first scheduled."""
    num_preemptions: int = 0


@dataclass
class EngineRun:
    records: list[Record]
    outcomes: dict[str, Outcome]
    num_schedules: int = 0
    """`schedule` calls that scheduled (or preempted) something: fewer than steps when windows ran."""


@dataclass
class StepRecorder:
    """Wraps a scheduler's `schedule` to keep one record per call; a record's free blocks are read at the
    next call (or at the end), once the step's finished requests have freed theirs."""

    scheduler: Scheduler
    records: list[Record] = field(default_factory=list)

    def __post_init__(self) -> None:
        schedule = self.scheduler.schedule

        def recorded(now: float) -> ScheduledBatch:
            self.close_last()
            assert now == int(now), f"a step started between seconds: {now}"
            running = {r.request_id for r in self.scheduler.running}
            batch = schedule(now)
            ids = [r.request_id for r in batch.requests]
            self.records.append(
                {
                    "step": int(now),
                    "scheduled": dict(zip(ids, batch.num_new_tokens, strict=True)),
                    "preempted": [r.request_id for r in batch.preempted],
                    "finished": [],
                    "free_blocks": None,
                    "admitted": {
                        r.request_id: r.num_computed_tokens
                        for r in batch.requests
                        if r.request_id not in running
                    },
                }
            )
            return batch

        self.scheduler.schedule = recorded  # type: ignore[method-assign]

    def close_last(self) -> None:
        if self.records and self.records[-1]["free_blocks"] is None:
            self.records[-1]["free_blocks"] = self.scheduler.blocks.num_free_blocks


def engine_config(sc: Scenario, runner: dict[str, Any], compute: str, macro_steps: bool) -> TestbedConfig:
    """The scenario's engine limits over the runner model `runner` (`RunnerConfig` fields)."""
    limits = ("block_size", "max_num_batched_tokens", "max_num_seqs", "max_model_len", "reserve_full_isl")
    scheduler = {k: sc[k] for k in limits}
    scheduler |= {
        "num_gpu_blocks_override": sc["num_gpu_blocks"],
        "enable_prefix_caching": sc["enable_prefix_caching"],
    }
    return build_config(
        {
            "runner": {**runner, "compute": compute, "macro_steps": macro_steps},
            "scheduler": scheduler,
            # not run: only the config's checks against the limits read it
            "workload": {
                "output_policy": "greedy" if compute == "real" else "forced",
                "prompt_len": 8,
                "output_len": 1,
            },
        }
    )


def run_engine(
    sc: Scenario,
    runner: dict[str, Any],
    *,
    compute: str = "real",
    macro_steps: bool = False,
    forced: dict[str, list[int]] | None = None,
) -> EngineRun:
    """`sc` through one mixed engine (`compute`: real, greedy; or skip, each request's `forced` tokens)."""
    cfg = engine_config(sc, runner, compute, macro_steps)
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(_serve(cfg, sc, forced))
    finally:
        loop.close()


async def _serve(cfg: TestbedConfig, sc: Scenario, forced: dict[str, list[int]] | None) -> EngineRun:
    pool = cfg.pools.mixed
    engine = build_engine(
        "mixed-0", "mixed", cfg, pool, Clock(), runner_for(cfg, pool), {}, None, time_model=OneSecondSteps()
    )
    recorder = StepRecorder(engine.scheduler)
    requests = [
        EngineRequest(
            spec["id"],
            list(spec["prompt_token_ids"]),
            spec["max_tokens"],
            arrival_time_s=float(spec["arrival_step"]),
            forced_output_token_ids=None if forced is None else forced[spec["id"]],
        )
        for spec in sc["requests"]
    ]
    clients = [asyncio.ensure_future(_client(engine, r)) for r in requests]  # queued in list order
    engine.start()
    outcomes = dict(zip((r.request_id for r in requests), await asyncio.gather(*clients), strict=True))
    await engine.drain()
    engine.assert_empty()
    recorder.close_last()
    records = [r for r in recorder.records if r["scheduled"] or r["preempted"]]  # not an idle look
    for r in records:
        r["finished"] = sorted(rid for rid, o in outcomes.items() if o.finished_step == r["step"])
    return EngineRun(records, outcomes, len(records))


async def _client(engine: EngineCore, request: EngineRequest) -> Outcome:
    """Read one request's stream to its end."""
    outcome = Outcome([], [])
    async for out in engine.generate(request):
        outcome.token_ids += out.new_token_ids
        outcome.token_steps += [round(t) - 1 for t in out.token_times_s]
        if out.finished_reason is not None:
            assert out.times is not None and out.times.finished_s is not None
            outcome.finished_reason = out.finished_reason
            outcome.finished_step = round(out.times.finished_s) - 1
            outcome.num_cached_tokens = out.times.num_cached_tokens
            outcome.num_preemptions = out.times.num_preemptions
    return outcome
