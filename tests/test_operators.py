"""The per-operator time model: each group's FLOPs and bytes against hand arithmetic from the models'
configs, DESIGN.md's ideal figures, the ring all-reduce, the CPU's share, and an engine running on it."""

import numpy as np
import pytest

from emulation.config import CpuOverhead, OperatorEfficiencies
from emulation.operators import OperatorRoofline
from emulation.profiles import GPUS, MODELS
from emulation.step_shape import StepItem
from tests.factories import COLLOCATED, make_config, make_requests, run_requests

PEAK = OperatorEfficiencies(1.0, 1.0, 1.0, 1.0, 1.0)
NO_CPU = CpuOverhead(0.0, 0.0, 0.0)
QWEN_IDEAL = OperatorRoofline(MODELS["qwen2.5-7b"], GPUS["l40s"], 1, PEAK, NO_CPU)


def test_qwen_groups_against_hand_arithmetic():
    """Qwen2.5-7B (28 layers, 3,584 wide, 28 query and 4 KV heads of 128, MLP 18,944, vocabulary
    152,064) on an L40S (96 MB L2): an 8,192-token prompt and two decodes at 8k in one step."""
    step = QWEN_IDEAL.step_time([StepItem(8192, 0, True), StepItem(1, 8191, True), StepItem(1, 4095, True)])
    t, L, h, q, kv, i, V = 8194, 28, 3584, 28 * 128, 2 * 4 * 128, 18944, 152064
    attn, mlp = h * (q + kv) + q * h, 3 * h * i
    qkv_o, mlp_g = step.group("qkv_o"), step.group("mlp")
    assert qkv_o.flops == 2 * L * attn * t and mlp_g.flops == 2 * L * mlp * t
    assert qkv_o.bytes == L * attn * 2  # x, qkv, o, out: 59-76 MB each, all in L2
    assert mlp_g.bytes == L * (mlp * 2 + t * (2 * i + i) * 2)  # gate-up (629 MB) and act (314 MB) spill
    prefill, decode = step.group("prefill_attention"), step.group("decode_attention")
    kv_token = 2 * L * 4 * 128 * 2  # 56 KiB
    assert prefill.flops == 4 * 28 * 128 * L * (8192 * 8193 // 2) and prefill.bytes == 8192 * kv_token
    assert decode.flops == 4 * 28 * 128 * L * (8192 + 4096) and decode.bytes == (8192 + 4096) * kv_token
    logits = step.group("logits")
    assert logits.flops == 2 * V * h * 3 and logits.bytes == V * h * 2 + 3 * V * 4
    assert step.total_s == pytest.approx(sum(g.total_s for g in step.groups)) and step.all_reduce_s == 0
    assert prefill.compute_s > prefill.memory_s and decode.memory_s > decode.compute_s


def test_a_chunk_with_no_logits_reads_no_lm_head():
    step = QWEN_IDEAL.step_time([StepItem(2048, 3072, False)])
    assert step.group("logits").bytes == 0 and step.group("logits").total_s == 0


def test_llama_70b_tp8_splits_weights_heads_and_kv():
    """Llama-3.1-70B (80 layers, 8,192 wide, 64 query and 8 KV heads, MLP 28,672) on eight H100s:
    each GPU holds an eighth of the weights and one KV head; 64 decodes at 4k are memory-bound."""
    m = OperatorRoofline(MODELS["llama-3.1-70b"], GPUS["h100-sxm"], 8, PEAK, NO_CPU)
    step = m.step_time([StepItem(1, 4095, True)] * 64)
    L, h, q, kv, i = 80, 8192, 64 * 128, 2 * 8 * 128, 28672
    assert step.group("qkv_o").bytes == L * (h * (q + kv) + q * h) * 2 / 8  # activations: all in L2
    assert step.group("mlp").flops == 2 * L * 3 * h * i * 64 / 8
    assert step.group("decode_attention").bytes == 64 * 4096 * (2 * L * 8 * 128 * 2) / 8
    assert step.group("decode_attention").memory_s > step.group("decode_attention").compute_s


def test_kv_heads_replicate_past_their_count():
    """Qwen2.5-7B has 4 KV heads: at TP 8 each GPU still holds one, a quarter of the KV, not an eighth."""
    tp8 = OperatorRoofline(MODELS["qwen2.5-7b"], GPUS["h100-sxm"], 8, PEAK, NO_CPU)
    step = tp8.step_time([StepItem(1, 8191, True)])
    assert step.group("decode_attention").bytes == 8192 * MODELS["qwen2.5-7b"].kv_bytes_per_token / 4


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_all_reduces_follow_the_ring_formula(tp):
    """Two per layer, each of tokens x hidden x 2 bytes: 2(tp-1)/tp of it over the TP link, plus a
    per-call latency."""
    gpu, eta = GPUS["h100-sxm"], OperatorEfficiencies()
    m = OperatorRoofline(MODELS["llama-3.1-70b"], gpu, tp, eta, NO_CPU)
    message = 2048 * 8192 * 2
    one = 2 * (tp - 1) / tp * message / (450e9 * eta.all_reduce_bandwidth) + gpu.all_reduce_latency_s
    step = m.step_time([StepItem(2048, 0, True)])
    assert step.all_reduce_s == pytest.approx(2 * 80 * one)
    assert step.total_s == pytest.approx(sum(g.total_s for g in step.groups) + step.all_reduce_s)
    assert (
        OperatorRoofline(MODELS["llama-3.1-70b"], gpu, 1).step_time([StepItem(2048, 0, True)]).all_reduce_s
        == 0
    )


def test_decode_kv_reads_add_to_a_chunk_instead_of_hiding_under_it():
    """32 decodes at 8k riding with a 2,016-token chunk: the aggregate roofline hides their 23 ms of KV
    reads under the chunk's compute; the operator model adds them (separate kernels)."""
    from emulation.roofline import Roofline

    decodes, chunk = [StepItem(1, 8192, True)] * 32, [StepItem(2016, 0, False)]
    ops = OperatorRoofline(MODELS["qwen2.5-7b"], GPUS["l40s"], 1, cpu=NO_CPU)
    agg = Roofline(MODELS["qwen2.5-7b"], GPUS["l40s"], 1, 0.47, 0.75)
    kv_read_s = 32 * 8193 * 57344 / (864e9 * 0.75)
    assert agg.step_time(decodes + chunk).total_s - agg.step_time(chunk).total_s < 0.2 * kv_read_s
    added = ops.step_time(decodes + chunk).total_s - ops.step_time(chunk).total_s
    assert kv_read_s < added < 1.25 * kv_read_s  # and their 32 tokens through the GEMMs and the LM head


def test_cpu_work_grows_with_requests_and_tokens():
    cpu = CpuOverhead(s_per_step=1e-3, s_per_request=2e-5, s_per_token=1e-7)
    m = OperatorRoofline(MODELS["qwen2.5-7b"], GPUS["l40s"], 1, cpu=cpu)
    one = m.step_time([StepItem(1, 1000, True)])
    many = m.step_time([StepItem(1, 1000, True)] * 200 + [StepItem(1000, 0, False)])
    assert one.cpu_s == pytest.approx(1e-3 + 2e-5 + 1e-7)
    assert many.cpu_s == pytest.approx(1e-3 + 201 * 2e-5 + 1200 * 1e-7)
    assert many.overhead_s == many.cpu_s and many.total_s == pytest.approx(many.gpu_s + many.cpu_s)


def test_an_engine_on_the_operator_model_takes_its_step_times():
    """One request alone, compute skip: every inter-token gap is the operator model's decode step at
    that context (CPU work included), and the first token comes after its prefill step."""
    cfg = make_config(COLLOCATED, runner={"compute": "skip"}, target={"time_model": "operators"})
    (req,) = make_requests(1, 500, 6, forced=True)
    (result,), _ = run_requests(cfg, [req])
    t = cfg.target
    model = OperatorRoofline(MODELS[t.model], GPUS["l40s"], 1, t.operators, t.cpu_overhead)
    gaps = np.diff(result.token_times_s)
    want = [model.step_time([StepItem(1, 500 + k, True)]).total_s for k in range(5)]
    assert gaps == pytest.approx(want, rel=1e-9)
    prefill_s = model.step_time([StepItem(500, 0, True)]).total_s
    assert result.token_times_s[0] - result.arrival_s - result.render_s == pytest.approx(prefill_s, rel=1e-9)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"operators": {"gemm_compute": 1.5}}, r"target\.operators\.gemm_compute=1\.5: must be in \(0, 1\]"),
        (
            {"cpu_overhead": {"s_per_request": -1.0}},
            r"target\.cpu_overhead\.s_per_request=-1\.0: must be >= 0",
        ),
        ({"time_model": "exact"}, r"target\.time_model='exact': must be 'aggregate' or 'operators'"),
    ],
)
def test_bad_time_model_settings_are_refused_naming_the_field(override, message):
    from cluster.config_load import ConfigError

    with pytest.raises(ConfigError, match=message):
        make_config(target=override)


@pytest.mark.parametrize("time_model", ["aggregate", "operators"])
def test_runs_report_the_cpu_share_of_step_time(time_model):
    """The engines' CPU work on the steps' path, over their busy time: in the summary, the report's
    table and `testbed:step_cpu_seconds` (aggregate: its fixed 2 ms a step)."""
    from cluster.virtual import run_virtual
    from dashboards import metrics as m
    from dashboards.exposition import sum_series

    workload = {"num_requests": 4, "prompt_len": 300, "output_len": 8, "rate": 2.0}
    cfg = make_config(
        COLLOCATED, runner={"compute": "skip"}, workload=workload, target={"time_model": time_model}
    )
    out = run_virtual(cfg)
    ((engine, report),) = out.engine_reports.items()
    share = out.summary["cpu_overhead_share"]
    assert 0 < share < 1 and share == pytest.approx(report.counters.cpu_s / report.counters.busy_s)
    assert sum_series([out.metrics[engine]], m.STEP_CPU.exposed) == pytest.approx(report.counters.cpu_s)
    if time_model == "aggregate":
        assert report.counters.cpu_s == pytest.approx(report.counters.num_steps * 0.002)
    else:  # and 14 µs per request each step
        assert report.counters.cpu_s > report.counters.num_steps * 0.002


def test_a_steps_work_per_gpu_splits_its_traffic_into_the_new_kv_written_and_the_rest_read():
    model = OperatorRoofline(MODELS["llama-3.1-70b"], GPUS["h100-sxm"], 4, PEAK, NO_CPU)
    step = model.step_time([StepItem(512, 1024, True), StepItem(1, 4095, True)])
    written = 513 * MODELS["llama-3.1-70b"].kv_bytes_per_token_per_gpu(4)
    assert step.write_bytes_per_gpu == written
    assert step.read_bytes_per_gpu + written == sum(g.bytes for g in step.groups)
    assert step.flops_per_gpu == sum(g.flops for g in step.groups)
