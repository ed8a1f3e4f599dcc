"""The replay driver: sends each request at its arrival time (or a trace's sessions, turn by turn:
`session_replay`) and collects every result."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from emulation.config import TestbedConfig
from emulation.vision import vision_encoder_of
from messages import ClientRequest, RequestResult
from workloads.closed_loop import ClosedLoop
from workloads.render_tier import RenderTier
from workloads.run_summary import WorkloadInfo
from workloads.session_replay import Clock, SessionReplay
from workloads.synthetic import synthetic_requests
from workloads.traces import load_trace
from workloads.traces.multi_turn import multi_turn_trace
from workloads.traces.prefix_reuse import theoretical_hit_rate
from workloads.traces.session import ChatPrompt, Trace
from workloads.traces.tokens import TokenSynthesizer

Workload = Sequence[ClientRequest] | Trace
"""Requests to send at their arrival times, or a trace's sessions."""


@dataclasses.dataclass(frozen=True)
class LoadedWorkload:
    """A workload and what it says of itself (`workload_info`), made once: a replay loads its trace and
    measures it once for all its designs."""

    workload: Workload
    info: WorkloadInfo


def load_workload(cfg: TestbedConfig, requests: Workload | LoadedWorkload | None = None) -> LoadedWorkload:
    """`requests` (default: `cfg`'s workload, `workload_for`) with its `workload_info`; one already
    loaded as it is."""
    if isinstance(requests, LoadedWorkload):
        return requests
    workload = workload_for(cfg) if requests is None else requests
    if isinstance(workload, Trace):  # described as replayed: its window, its turns
        workload = workload.replayed(cfg.replay.window_s, cfg.replay.max_turns)
    return LoadedWorkload(workload, {**workload_info(workload, cfg.replay.speedup), **load_info(cfg)})


def load_info(cfg: TestbedConfig) -> WorkloadInfo:
    """Summary keys of how the load is sent, where it is not the default: the closed loop's
    `max_concurrency` (vLLM's key) and its rate, inf (as `vllm bench serve --max-concurrency` at its
    default `--request-rate inf`: every request ready at the start, `workload.rate` unused), and the
    warm-up's size (none for a default run)."""
    w = cfg.workload
    info: WorkloadInfo = {}
    if w.max_concurrency is not None:
        info["max_concurrency"], info["rate"] = w.max_concurrency, math.inf
    if w.num_warmup_requests:
        info["num_warmup_requests"] = w.num_warmup_requests
    return info


def workload_for(cfg: TestbedConfig) -> Workload:
    """What `cfg` replays: the synthetic requests, or the trace (loaded and checked here)."""
    if cfg.workload.kind == "trace":
        r = cfg.replay
        assert r.trace is not None  # checked with the config
        return load_trace(r.trace, r.format, r.window_s, r.clients, cfg.seed)
    if cfg.workload.kind == "multi_turn":
        return multi_turn_trace(cfg.multi_turn, cfg.runner.vocab_size, cfg.seed)
    return synthetic_requests(cfg.workload, cfg.runner.vocab_size, cfg.seed, image_patch_size(cfg))


def image_patch_size(cfg: TestbedConfig) -> int | None:
    """The pixel size of generated images' patches: the target's, when real compute encodes them."""
    vit = vision_encoder_of(cfg.target.model)
    return vit.patch_size if vit is not None and cfg.runner.compute == "real" else None


def needs_render(workload: Workload) -> bool:
    """Whether `workload` holds chat prompts, which the render tier's template turns into tokens."""
    return isinstance(workload, Trace) and any(
        isinstance(t.prompt, ChatPrompt) for s in workload.all_sessions() for t in s.turns
    )


def workload_info(workload: Workload, speedup: float = 1.0) -> WorkloadInfo:
    """Summary keys the workload contributes: a trace's nominal rate (its requests over its time span
    as the trace paces them, sped up: the same for every design, though closed loop sends as the
    system answers), size, and theoretical prefix-hit rate (an infinite cache's; compare
    `prefix_hit_rate`, what the engines achieved)."""
    if not isinstance(workload, Trace):
        return {}
    times = [t.t_s for s in workload.all_sessions() for t in s.turns]
    span_s = (max(times) - min(times)) / speedup
    return {
        "rate": round(len(times) / span_s, 4) if span_s > 0 else 0.0,
        "trace": workload.name,
        "num_sessions": len(workload.sessions),
        "theoretical_prefix_hit_rate": theoretical_hit_rate(workload),
        "theoretical_prefix_hit_rate_with_answers": theoretical_hit_rate(workload, with_answers=True),
    }


async def run_workload(
    submit: Callable[[ClientRequest], Awaitable[RequestResult]],
    workload: Workload,
    clock: Clock,
    cfg: TestbedConfig,
    render: RenderTier | None,
    on_result: Callable[[RequestResult], None] | None = None,
    lead_s: float = 0.0,
    render_chat: Callable[[list[dict[str, Any]]], list[int]] | None = None,
) -> list[RequestResult]:
    """Replay `workload` through `submit` (see `replay`, `ClosedLoop` under workload.max_concurrency,
    and `SessionReplay`); `render_chat`: the render tier's template and tokenizer, for a trace of chat
    prompts."""
    if isinstance(workload, Trace):
        synth = TokenSynthesizer(cfg.runner.vocab_size, workload.block_size, cfg.seed, render_chat)
        forced = cfg.workload.output_policy == "forced"
        images = (vision_encoder_of(cfg.target.model) is not None, image_patch_size(cfg))
        driver = SessionReplay(submit, clock, synth, cfg.replay, render, on_result, lead_s, forced, images)
        return await driver.run(workload)
    if cfg.workload.max_concurrency is not None:  # closed loop: sent as slots free, never ahead
        closed = ClosedLoop(submit, clock, cfg.workload.max_concurrency, render, on_result)
        return await closed.run(workload)
    return await replay(submit, workload, clock, on_result, lead_s, render)


async def replay(
    submit: Callable[[ClientRequest], Awaitable[RequestResult]],
    requests: Sequence[ClientRequest],
    clock: Clock,
    on_result: Callable[[RequestResult], None] | None = None,
    lead_s: float = 0.0,
    render: RenderTier | None = None,
) -> list[RequestResult]:
    """Submit requests on schedule (never waiting on earlier ones); results in request order.

    `lead_s` (emulated) sends each request that much ahead of its arrival time, to cover the real
    hops to the engine; engines hold a request until its arrival time.
    `render`: the render tier's cost model; each request's `render_s` comes from it (None: the
    requests' own `render_s`).
    """

    async def one(creq: ClientRequest) -> RequestResult:
        result = await submit(creq)
        if on_result is not None:
            on_result(result)
        return result

    tasks = []
    for creq in sorted(requests, key=lambda r: r.arrival_s):
        if render is not None:
            creq = render.rendered(creq)
        await clock.sleep_until(creq.arrival_s - lead_s)
        tasks.append(asyncio.ensure_future(one(creq)))
    results = await asyncio.gather(*tasks)
    order = {r.request_id: i for i, r in enumerate(requests)}
    return sorted(results, key=lambda r: order[r.request_id])
