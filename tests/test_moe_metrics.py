"""MoE targets' steps as series, step logs and report plots: each step's expert load (what
`emulation.moe.ExpertPlacement` expects of its tokens), EP imbalance, all-to-alls and what dual-batch
overlap hid; the same with macro steps on and off; nothing of it for a dense target."""

from __future__ import annotations

import functools
import json
import operator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import actors.engine.window.run as windows_module
from actors.engine.core import EngineCore
from cluster.outcome import RunOutput, clean_json, write_json
from cluster.virtual import run_virtual
from dashboards import metrics as m
from dashboards.exposition import sample_values, sum_series
from dashboards.moe_plots import moe_steps_figure
from dashboards.plot_style import visible_designs
from dashboards.report import write_report
from emulation.moe import ExpertPlacement, expert_popularity
from emulation.profiles import MODELS
from messages.moe_steps import MoeStepLog, MoeWork
from tests.factories import COLLOCATED, PD, make_config

MOE = "qwen3-30b-a3b"
ZIPF_S, ROUTING_SEED = 1.2, 3
ROUTING = {"skew": "zipf", "zipf_s": ZIPF_S, "seed": ROUTING_SEED}
POOLS = {
    "prefill": {"replicas": 1, "gpu": "h100-sxm", "ep": 4},  # attention over all 4 GPUs: no all-to-alls
    "decode": {
        "replicas": 1, "gpu": "h100-sxm", "ep": 2, "dp_attention": True, "enable_dbo": True,
        "num_redundant_experts": 4,
    },
}  # fmt: skip
WORKLOAD = {"num_requests": 80, "rate": 400.0, "prompt_len": 1500, "output_len": 120}
"""Prompts of 1,500 tokens in chunks of 1,024 (a chunk that emits nothing), 120-token answers; enough at
once that decode steps pass vLLM's 32 tokens a rank, where dual-batch overlap splits them."""
MOE_NAMES = {spec.exposed for spec in m.MOE_SERIES}


def moe_config(layer: dict[str, Any], macro_steps: bool, **sections: Any) -> Any:
    """`layer` (pools) on the MoE target, compute skip, prompt chunks of 1,024 tokens; `sections` on top."""
    base = {
        "target": {"model": MOE, "moe_routing": ROUTING},
        "runner": {"compute": "skip", "macro_steps": macro_steps},
        "scheduler": {"max_num_batched_tokens": 1024},
        "workload": WORKLOAD,
    }
    return make_config(base, layer, sections)


@pytest.fixture(scope="module")
def pd_run() -> tuple[RunOutput, dict[str, list[float]]]:
    """A P/D MoE run a step at a time, with each engine's step ends as its loop saw them."""
    ends: dict[str, list[float]] = {}
    step = EngineCore._step

    async def spy(self: EngineCore, batch: Any, start: float) -> float:
        end = await step(self, batch, start)
        ends.setdefault(self.engine_id, []).append(end)
        return end

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(EngineCore, "_step", spy)
        out = run_virtual(moe_config(PD, False, pools={"mixed": {"replicas": 0}, **POOLS}))
    return out, ends


def test_each_step_is_recorded_as_the_expert_placement_expects(pd_run):
    out, ends = pd_run
    moe = MODELS[MOE].moe
    assert moe is not None
    popularity = expert_popularity("zipf", moe.num_experts, ZIPF_S, None, ROUTING_SEED)
    for engine, ep, redundant in (("prefill-0", 4, 0), ("decode-0", 2, 4)):
        placement = ExpertPlacement(popularity, moe.num_experts_per_tok, ep, redundant)
        log = out.engine_reports[engine].moe_steps  # type: ignore[union-attr]
        text = out.metrics[engine]
        num_steps = int(sum_series([text], m.STEPS.exposed))
        assert log is not None and len(log.end_s) == num_steps == len(ends[engine]) < 1024  # a point a step
        assert log.end_s == pytest.approx(ends[engine], rel=1e-13, abs=0)  # chunks' ends too (no tokens)
        assert sum(log.num_tokens) == sum_series([text], m.ITERATION_TOKENS.sum)
        loads = [placement.load(int(n)) for n in log.num_tokens]
        top_k, num_experts = moe.num_experts_per_tok, moe.num_experts
        assert log.mean_tokens_per_expert == [n * top_k / num_experts for n in log.num_tokens]
        assert log.max_tokens_per_expert == [x.max_tokens_per_expert for x in loads]
        assert log.imbalance == [x.imbalance for x in loads]
        for spec, values in (
            (m.MOE_MAX_TOKENS_PER_EXPERT, log.max_tokens_per_expert),
            (m.MOE_MEAN_TOKENS_PER_EXPERT, log.mean_tokens_per_expert),
            (m.MOE_EP_IMBALANCE, log.imbalance),
            (m.MOE_ALL_TO_ALL, log.all_to_all_s),
        ):
            assert sum_series([text], spec.count) == num_steps, spec.name
            assert sum_series([text], spec.sum) == functools.reduce(operator.add, values, 0.0), spec.name
            first = float(spec.buckets[0])  # type: ignore[index]
            assert sum_series([text], spec.bucket, le=str(first)) == sum(v <= first for v in values), (
                spec.name
            )
        hidden = sum_series([text], m.MOE_DBO_HIDDEN.exposed)
        assert hidden == functools.reduce(operator.add, log.overlap_s, 0.0)
    prefill, decode = (out.engine_reports[e].moe_steps for e in ("prefill-0", "decode-0"))
    assert prefill is not None and decode is not None
    assert not any(prefill.all_to_all_s) and not any(prefill.overlap_s)  # no DP attention, no DBO
    # decode steps split from vLLM's 32 tokens a rank (2 ranks) and hide part of their all-to-alls then
    for a, h, n in zip(decode.all_to_all_s, decode.overlap_s, decode.num_tokens, strict=True):
        assert a > 0 and (a > h > 0 if n / 2 >= 32 else h == 0)
    assert any(decode.overlap_s)
    assert max(prefill.num_tokens) == 1024 and min(decode.imbalance) > 1.0


def test_the_series_carry_the_engines_labels_and_vllm_has_none_of_them(pd_run):
    out, _ = pd_run
    ep_series = [spec for spec in m.MOE_SERIES if spec not in m.AFD_SERIES]  # AFD's: test_afd_metrics.py
    for spec in m.MOE_SERIES:
        assert spec.name.startswith(("testbed:moe_", "testbed:afd_")) and spec.common == m.COMMON_LABELS
    for engine in ("prefill-0", "decode-0"):
        fams = {f.name: f for f in text_string_to_metric_families(out.metrics[engine])}
        for spec in ep_series:
            labels = {k for s in fams[spec.name].samples for k in s.labels} - {"le"}
            assert labels == set(m.COMMON_LABELS), spec.name
    assert not any(n in out.metrics["proxy"] for n in MOE_NAMES)


def run_counting_windows(cfg: Any) -> tuple[RunOutput, int, int]:
    """A run, the windows it planned, and of them those with a prompt chunk."""
    planned = []
    plan = windows_module.plan_window

    def spy(*args: Any, **kwargs: Any) -> Any:
        window = plan(*args, **kwargs)
        planned.append(window)
        return window

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(windows_module, "plan_window", spy)
        out = run_virtual(cfg)
    return out, sum(w is not None for w in planned), sum(w is not None and bool(w.chunks) for w in planned)


def test_macro_steps_record_the_same_steps_in_pd(pd_run):
    """Prefill's chunk-only windows (their steps stamp nothing until the last) and decode's."""
    one, _ = pd_run
    many, num_windows, num_chunked = run_counting_windows(
        moe_config(PD, True, pools={"mixed": {"replicas": 0}, **POOLS})
    )
    assert num_windows > 0 and num_chunked > 0, "no window (with a prompt chunk) ran: nothing compared"
    assert one.engine_reports == many.engine_reports  # the step logs among them
    for actor in one.metrics:
        assert sample_values(one.metrics[actor]) == sample_values(many.metrics[actor]), actor


@pytest.mark.parametrize("time_model", ["aggregate", "operators"])
def test_macro_steps_record_the_same_steps(time_model):
    """Collocated, DP attention over 4 ranks (4,096 tokens a step): 10,000-token prompts in chunks
    beside decodes, the windows with and without a chunk."""
    mixed = {"mixed": {"replicas": 1, "gpu": "h100-sxm", "ep": 4, "dp_attention": True, "enable_dbo": True}}
    long_prompts = {"prompt_len": 10_000, "output_len": 60, "rate": 2.0}
    (one, _, _), (many, num_windows, num_chunked) = (
        run_counting_windows(
            moe_config(
                COLLOCATED, macro, pools=mixed, target={"time_model": time_model}, workload=long_prompts
            )
        )
        for macro in (False, True)
    )
    assert num_windows > 0 and num_chunked > 0, "no window (with a prompt chunk) ran: nothing compared"
    assert one.engine_reports == many.engine_reports  # the step logs among them
    log = one.engine_reports["mixed-0"].moe_steps  # type: ignore[union-attr]
    assert log is not None and len(log.end_s) > 100
    for actor in one.metrics:
        assert sample_values(one.metrics[actor]) == sample_values(many.metrics[actor]), actor
    assert sum_series([one.metrics["mixed-0"]], m.MOE_DBO_HIDDEN.exposed) > 0


def test_a_dense_target_exports_and_logs_none_of_it():
    out = run_virtual(
        make_config(COLLOCATED, runner={"compute": "skip"}, workload={**WORKLOAD, "num_requests": 3})
    )
    for actor, text in out.metrics.items():
        names = [f.name for f in text_string_to_metric_families(text)]
        assert not any(n.startswith(("testbed:moe_", "testbed:afd_")) for n in names), actor
    assert all(r.moe_steps is None for r in out.engine_reports.values())  # type: ignore[union-attr]
    assert moe_steps_figure({"dense": clean_json(dict(out.engine_reports))}) is None


def test_the_report_of_a_moe_run_plots_each_engines_steps_and_tabulates_their_means(pd_run, tmp_path):
    out, _ = pd_run
    design = str(out.summary["design"])
    write_json(tmp_path / "engines.json", {design: dict(out.engine_reports)})
    page = write_report(tmp_path, out.results, [clean_json(out.summary)], "moe", []).read_text()
    assert (tmp_path / "plots" / "moe_steps.png").stat().st_size > 10_000
    assert 'alt="moe_steps"' in page and "MoE steps per engine" in page
    decode = out.engine_reports["decode-0"].moe_steps  # type: ignore[union-attr]
    assert decode is not None
    row = f"<td>{design}</td><td>decode-0</td><td>{len(decode.end_s):,}</td>"
    assert row in page
    engines = json.loads((tmp_path / "engines.json").read_text())
    fig = moe_steps_figure(engines)
    assert fig is not None
    fig.canvas.draw()
    assert len(fig.axes) == 3 * 2 and all(visible_designs(ax) == {design} for ax in fig.axes)


def steps(*num_tokens: int) -> MoeWork:
    """Steps whose figures follow their tokens (imbalance 1 + tokens / 10)."""
    n = [float(t) for t in num_tokens]
    zeros = ([0.0] * len(n) for _ in range(8))  # no all-to-all, overlap or AFD
    return MoeWork(n, n, [t / 2 for t in n], [1 + t / 10 for t in n], *zeros)


def test_the_step_log_times_unstamped_steps_and_merges_pairs_when_full():
    log = MoeStepLog(max_points=4)
    log.add([0.5], [], steps(1))  # a prompt chunk: no token, its end not known yet
    assert log.snapshot().end_s == [0.5]  # so far: one after another from the last known end (0)
    log.add([0.25, 1.0], [7.0, 8.0], steps(2, 3))
    snap = log.snapshot()
    assert snap.end_s == [6.75, 7.0, 8.0] and snap.num_steps == [1, 1, 1]  # it ended as the next began
    assert snap.num_tokens == [1, 2, 3] and snap.mean_tokens_per_expert == [0.5, 1.0, 1.5]
    for i in range(3):  # six steps: four points merge pairwise, then points of two
        log.add([1.0], [9.0 + i], steps(1))
    snap = log.snapshot()
    assert snap.num_steps == [2, 2, 2] and snap.end_s == [7.0, 9.0, 11.0]
    assert snap.num_tokens == [1.5, 2.0, 1.0] and snap.imbalance == pytest.approx([1.15, 1.2, 1.1])
    log.add([1.0], [], steps(1))
    assert log.snapshot().num_steps == [2, 2, 2, 1] and log.snapshot().end_s[-1] == 12.0
    log.add([1.0], [20.0], steps(1))  # the snapshots left the unstamped step to its stamp: 19
    snap = log.snapshot()  # full again: points of four
    assert snap.num_steps == [4, 4] and snap.end_s == [9.0, 20.0] and snap.num_tokens == [1.75, 1.0]
    assert log.num_steps == 8
