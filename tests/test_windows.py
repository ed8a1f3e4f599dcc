"""`runner.macro_steps` (windows of steps, clients woken only at their request's end): a run with them
is the run a step at a time, each token streamed, gives, exactly."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram

import actors.engine.window.run as windows_module
from actors.engine.kv_cache.step_blocks import new_block_runs
from actors.engine.request import Request
from cluster.config_load import load_designs
from cluster.virtual import run_virtual
from dashboards.exposition import sample_values
from dashboards.recorders.registry import Observed
from emulation.operators import OperatorRoofline
from emulation.profiles import GPUS, MODELS
from emulation.roofline import Roofline
from emulation.step_shape import StepItem, StepShape, decode_step, decode_steps
from messages import EngineRequest

MOONCAKE = (
    Path(__file__).resolve().parents[2]
    / "shared/traces/mooncake_fast25/conversation_trace.window_0s_1200s.jsonl"
)
"""Whole-second arrivals: many events due at once."""
GPT_OSS = [  # sliding-window layers (gpt-oss): blocks freed as requests advance
    "target.model=gpt-oss-120b",
    "workload.kind=synthetic",
    "workload.rate=4",
    "workload.prompt_len=3000",
    "workload.output_len=300",
]
CASES = {  # id: (preset, design, overrides): every role, handoff mode and router the windows meet
    "collocated": ("guide-l40s", "collocated", ["workload.rate=2.0"]),
    "pd-pull": ("guide-l40s", "pd-testbox", ["workload.rate=1.0"]),
    "pd-push": ("guide-l40s", "pd-fast", ["workload.rate=1.5", "kv_transfer.mode=push"]),
    "kv-aware": ("guide-l40s", "collocated", ["workload.rate=1.0", "router.policy=kv_aware"]),
    "preempting": (
        "guide-l40s",
        "collocated",
        ["workload.rate=2.0", "scheduler.num_gpu_blocks_override=1200", "scheduler.max_model_len=16384"],
    ),
    "bidirectional": ("six-turn-l40s", "pd-bidirectional", ["multi_turn.num_conversations=6"]),
    "e-pd-operators": ("epd-a100", "e-pd", ["workload.rate=8", "workload.output_len=40"]),
    "trace": ("agentic-h200", "collocated", [f"replay.trace={MOONCAKE}", "replay.window_s=[0,30]"]),
    "sliding-window": ("agentic-h200", "collocated", [*GPT_OSS, "scheduler.max_num_batched_tokens=1024"]),
    "sliding-window-preempting": (  # blocks leave windows between a window's steps, and run short
        "agentic-h200",
        "collocated",
        [
            *GPT_OSS,
            "scheduler.num_gpu_blocks_override=600",
            "scheduler.max_num_batched_tokens=1024",
            "scheduler.max_model_len=4096",
            "scheduler.reserve_full_isl=false",
            "pools.mixed.replicas=1",
        ],
    ),
    "sliding-window-pd": ("agentic-h200", "pd", GPT_OSS),
    "kv-aware-evicting": (  # the router reads evictions made mid-window: they must have reached it
        "six-turn-l40s",
        "collocated",
        [
            "router.policy=kv_aware",
            "pools.mixed.replicas=3",
            "scheduler.num_gpu_blocks_override=3000",
            "multi_turn.num_conversations=24",
        ],
    ),
}


def run(case: str, macro_steps: bool) -> tuple[object, int, int]:
    """`case` with or without macro steps; the windows planned, and of them those with a prompt
    chunk."""
    preset, design, sets = CASES[case]
    overrides = [
        *sets,
        "runner.compute=skip",
        "workload.num_requests=40",
        f"runner.macro_steps={macro_steps}",
    ]
    (cfg,) = load_designs(preset, [design], overrides)
    planned, chunked = [], []
    plan = windows_module.plan_window

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        window = plan(*args, **kwargs)
        planned.append(window is not None)
        chunked.append(window is not None and bool(window.chunks))
        return window

    windows_module.plan_window = spy
    try:
        return run_virtual(cfg), sum(planned), sum(chunked)
    finally:
        windows_module.plan_window = plan


def same(a: object, b: object) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("case", list(CASES))
def test_windows_change_nothing(case: str) -> None:
    (one, *_), (many, num_windows, num_chunked) = run(case, False), run(case, True)
    assert num_windows > 0, "no window ran: the comparison would prove nothing"
    if case in (
        "collocated",
        "pd-pull",
        "preempting",
        "sliding-window",
    ):  # prompt chunks: beside decodes, or alone
        assert num_chunked > 0, "no window with a prompt chunk ran"
    assert one.summary.keys() == many.summary.keys()
    assert all(same(one.summary[k], many.summary[k]) for k in one.summary), {
        k: (one.summary[k], many.summary[k]) for k in one.summary if not same(one.summary[k], many.summary[k])
    }
    assert one.engine_reports == many.engine_reports
    assert one.metrics.keys() == many.metrics.keys()
    for actor in one.metrics:  # every series (but `_created`), float sums too: added one at a time either way
        assert sample_values(one.metrics[actor]) == sample_values(many.metrics[actor]), actor
    cols = ["request_id", "finished_reason", "num_output_tokens", "token_times_s", "ttft_s", "e2el_s"]
    for col in cols:
        assert [
            list(v) if hasattr(v, "__len__") and not isinstance(v, str) else v for v in one.results[col]
        ] == [
            list(v) if hasattr(v, "__len__") and not isinstance(v, str) else v for v in many.results[col]
        ], col


@pytest.mark.parametrize(
    "model",
    [
        Roofline(MODELS["qwen2.5-7b"], GPUS["l40s"], 1, 0.47, 0.75, 0.002),
        OperatorRoofline(MODELS["llama-3.1-70b"], GPUS["h100-sxm"], 4),
    ],
    ids=["aggregate", "operators-tp4"],
)
def test_window_step_times_are_single_steps_bit_for_bit(model: object) -> None:
    contexts = [17, 100, 5000, 8191]
    shape = StepShape.of(StepItem(1, c, True) for c in contexts)
    window = model.step_time_of(decode_steps(shape, 300))  # type: ignore[attr-defined]
    single = [
        model.step_time_of(StepShape.of(StepItem(1, c + i, True) for c in contexts)).total_s  # type: ignore[attr-defined]
        for i in range(300)
    ]
    assert window.total_s.tolist() == single


@pytest.mark.parametrize("many_values", [False, True], ids=["few", "many"])
def test_running_histogram_exposes_what_observing_each_does(many_values: bool) -> None:
    values = [0.0, 0.001, 0.02, 0.02, 0.5, 7.0, 1e9, 0.1 + 0.2] * (20 if many_values else 1)  # by numpy
    a, b = CollectorRegistry(), CollectorRegistry()
    one, many = (Histogram("h", "", registry=r, buckets=(0.01, 0.02, 1.0)) for r in (a, b))
    running = Observed(many)

    def samples() -> list[dict]:
        running.sync()
        out = [
            {(s.name, s.labels.get("le")): s.value for m in r.collect() for s in m.samples} for r in (a, b)
        ]
        assert out[0].pop(("h_created", None)) <= out[1].pop(("h_created", None))  # when made
        return out

    for v in values:
        one.observe(v)
    running.observe_many(values[:3])
    running.observe_many(values[3:])
    exact, mine = samples()
    assert exact == mine  # the sum to the bit
    assert mine[("h_bucket", "0.02")] == 4 * (20 if many_values else 1)
    one.observe(float("nan"))
    running.observe(float("nan"))  # in no bucket, as prometheus_client's
    exact, mine = samples()
    assert exact.pop(("h_sum", None)) != exact[("h_count", None)] and exact == {k: mine[k] for k in exact}


def test_window_blocks_come_in_the_order_single_steps_take_them() -> None:
    """Decodes allocate every `block_size` steps from where their last block fills: the window's
    round-by-round order is the (step, batch position) order single steps take blocks in."""
    rng = random.Random(0)
    for _ in range(200):
        bs, num_steps = rng.choice([1, 4, 16]), rng.randrange(1, 80)
        requests = []
        for i in range(rng.randrange(1, 12)):
            req = Request(EngineRequest(str(i), [1] * rng.randrange(1, 100), 4), 0.0)
            req.num_computed_tokens = req.num_prompt_tokens - 1
            req.block_ids = list(range(-(-req.num_prompt_tokens // bs)))
            requests.append(req)
        expected = sorted(
            (i, r)
            for r, req in enumerate(requests)
            for i in range(max(1, len(req.block_ids) * bs - req.num_computed_tokens), num_steps, bs)
        )
        assert new_block_runs(requests, [], bs, num_steps) == [(i, r, 1) for i, r in expected]


def test_a_decode_step_ahead_keeps_every_field() -> None:
    values = {f.name: 10 + i for i, f in enumerate(dataclasses.fields(StepShape))}
    values["num_decodes"] = values["num_new_tokens"]  # decode-only
    shape = StepShape(**values)
    ahead = decode_step(shape, 3)
    grown = ("keys_attended", "num_context_tokens", "decode_keys_attended")
    assert {f: getattr(ahead, f) - values[f] for f in values} == {
        f: 3 * values["num_decodes"] if f in grown else 0 for f in values
    }
