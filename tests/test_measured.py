"""The measured time model (emulation/measured.py): each group is the tables' kernels at the step's
shapes times the layers that run them, what the tables lack keeps its roofline and is counted out of
the measured share, a window of decode steps gets the bits single steps get, and a run says how much
of its step time was measured, from which tables."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cluster.config_load import ConfigError, config_to_dict
from cluster.virtual import run_virtual
from emulation.config import CpuOverhead
from emulation.config.model import MEASURED_S_PER_STEP
from emulation.kernel_tables import tables_for
from emulation.measured import MeasuredGroupTime, MeasuredKernels
from emulation.operators import OperatorRoofline
from emulation.silicon_systems import package_dir
from emulation.step_shape import StepShape, decode_step, decode_steps
from emulation.time_model import time_model_for
from tests.factories import COLLOCATED, PD, make_config

pytestmark = pytest.mark.skipif(package_dir() is None, reason="aiconfigurator-core is not installed")


def measured(gpu: str = "h100-sxm", model: str = "qwen2.5-7b", tp: int = 1, **target) -> MeasuredKernels:
    cfg = make_config(COLLOCATED, target={"time_model": "measured", "model": model, **target},
                      pools={"mixed": {"gpu": gpu, "tp": tp}})  # fmt: skip
    m = time_model_for(cfg, cfg.pools.mixed)
    assert isinstance(m, MeasuredKernels)
    return m


def shape(*items: tuple[int, int]) -> StepShape:
    s = StepShape()
    for n, c in items:
        s.add(n, c, True)
    return s


def test_each_group_is_the_tables_kernels_at_the_steps_shapes_times_their_layers():
    m = measured(tp=2)
    tables, h = tables_for("h100-sxm"), 3584  # Qwen2.5-7B: 28 layers, 28 query and 4 KV heads of 128
    step = m.step_time_of(shape((1004, 3000), *[(1, 2047)] * 20))  # 1,024 tokens, KV 2,048: grid points
    groups = {g.name: g for g in step.groups}
    t = 1024

    def s(k):
        assert k is not None and k.measured
        return k.s

    assert groups["qkv_o"].total_s == pytest.approx(
        28 * (s(tables.gemm(t, 14 * 128 + 2 * 2 * 128, h, "bf16")) + s(tables.gemm(t, h, 14 * 128, "bf16")))
    )
    assert groups["mlp"].total_s == pytest.approx(
        28 * (s(tables.gemm(t, 2 * 18944 // 2, h, "bf16")) + s(tables.gemm(t, h, 18944 // 2, "bf16")))
    )
    assert groups["prefill_attention"].total_s == pytest.approx(
        28 * s(tables.context_attention(1, 1004, 3000, 14, 2, 128, 2))
    )
    assert groups["decode_attention"].total_s == pytest.approx(
        28 * s(tables.generation_attention(20, 2048, 14, 2, 128, 2))
    )
    assert groups["logits"].total_s == pytest.approx(s(tables.gemm(21, 152064 // 2, h, "bf16")))
    ar = tables.all_reduce(t, h, 2)
    assert step.all_reduce_s == pytest.approx(56 * s(ar))  # after attention and after the MLP
    norms, act = tables.elementwise(t, 2 * h, 2 * h), tables.elementwise(t, 18944, 18944 // 2)
    assert norms is not None and act is not None and not norms.measured  # the package's formula
    assert groups["elementwise"].total_s == pytest.approx(56 * norms.s + 28 * act.s)
    assert norms.s < tables.elementwise(2 * t, 2 * h, 2 * h).s  # grows with the tokens
    assert all(isinstance(g, MeasuredGroupTime) for g in step.groups)
    assert step.measured_s == pytest.approx(step.gpu_s - groups["elementwise"].total_s)
    same = shape((1004, 3000), *[(1, 2047)] * 20)
    operators = OperatorRoofline(m.model, m.gpu, 2, cpu=m.cpu)
    assert step.cpu_s == operators.step_time_of(same).cpu_s  # the per-operator model's formula


def s_of(k) -> float:
    assert k is not None and k.measured
    return k.s


def test_an_mla_models_attention_is_the_tables_whole_module_its_projections_included():
    m = measured(gpu="h200", model="deepseek-v3", tp=8)  # 61 MLA layers, 128 heads: 16 a GPU
    tables = tables_for("h200")
    step = m.step_time_of(shape((1000, 3000), *[(1, 2047)] * 20))
    assert step.group("prefill_attention").total_s == pytest.approx(
        61 * s_of(tables.mla_context(1, 1000, 3000, 16, 2, "fp8_block"))
    )
    assert step.group("decode_attention").total_s == pytest.approx(
        61 * s_of(tables.mla_generation(20, 2048, 16, 2, "fp8_block"))
    )
    qkv_o = step.group("qkv_o")  # the modules run every projection
    assert isinstance(qkv_o, MeasuredGroupTime) and qkv_o.total_s == 0
    longer = m.step_time_of(shape((1000, 7000))).group("prefill_attention").total_s
    assert longer > m.step_time_of(shape((1000, 3000))).group("prefill_attention").total_s


def test_without_a_whole_module_an_mla_models_attention_is_its_kernels_and_projections():
    m = measured(gpu="h200", model="deepseek-v3", tp=8, kernel_tables={"backend": "sglang"})
    tables, h = tables_for("h200", "sglang"), 7168
    step = m.step_time_of(shape((1000, 3000), *[(1, 2047)] * 20))
    projections = [tables.gemm(1020, 1536 + 512 + 64, h, "fp8_block"),  # q and KV down, rotary key
                   tables.gemm(1020, 16 * 192, 1536, "fp8_block"),  # q up
                   tables.gemm(1020, h, 16 * 128, "fp8_block")]  # out  # fmt: skip
    assert step.group("qkv_o").total_s == pytest.approx(61 * sum(s_of(k) for k in projections))
    assert step.group("prefill_attention").total_s == pytest.approx(61 * (
        s_of(tables.gemm(4000, 16 * 256, 512, "fp8_block"))  # KV up, over the cached keys too
        + s_of(tables.mla_context_attention(1, 1000, 3000, 16, 2))
    ))  # fmt: skip
    assert step.group("decode_attention").total_s == pytest.approx(61 * (
        s_of(tables.mla_bmm(20, 16, "fp8_block", True)) + s_of(tables.mla_bmm(20, 16, "fp8_block", False))
        + s_of(tables.mla_generation_attention(20, 2048, 16, 2))
    ))  # fmt: skip


def test_an_mla_geometry_the_tables_never_measured_keeps_its_rooflines():
    from emulation.mla import MlaGeometry

    m = measured(gpu="h200", model="deepseek-v3", tp=8)
    lite = dataclasses.replace(m.model, mla=MlaGeometry(512, 128, 64, 128, q_lora_rank=None))
    other = dataclasses.replace(m, model=lite)
    step = other.step_time_of(shape((1000, 0), (1, 2047)))
    ops = OperatorRoofline(lite, m.gpu, 8, experts=m.experts).step_time_of(shape((1000, 0), (1, 2047)))
    for name in ("qkv_o", "prefill_attention", "decode_attention"):
        assert not isinstance(step.group(name), MeasuredGroupTime)
        assert step.group(name).total_s == ops.group(name).total_s


def test_a_gated_delta_nets_projections_and_scans_are_its_tables_kernels():
    m = measured(gpu="h200", model="qwen3-next-80b-a3b", tp=4)  # 36 GDN layers: 16 key, 32 value heads of 128
    tables, h = tables_for("h200"), 2048
    step = m.step_time_of(shape((1000, 0), *[(1, 2047)] * 20))
    gdn = (h, 4, 128, 8, 128, 4)
    assert step.group("ssm_scan").total_s == pytest.approx(36 * (
        s_of(tables.gdn("causal_conv1d_fn", 1, 1000, *gdn))
        + s_of(tables.gdn("chunk_gated_delta_rule", 1, 1000, *gdn))
        + s_of(tables.gdn("causal_conv1d_update", 20, 1, *gdn))
        + s_of(tables.gdn("fused_sigmoid_gating_delta_rule_update", 20, 1, *gdn))
    ))  # fmt: skip
    proj = [tables.gemm(1020, 2 * (16 * 128 + 32 * 128) // 4, h, "bf16"),  # in_proj_qkvz
            tables.gemm(1020, 2 * 32 // 4, h, "bf16"),  # in_proj_ba
            tables.gemm(1020, h, 32 * 128 // 4, "bf16")]  # out_proj  # fmt: skip
    assert all(k is not None for k in proj)
    assert step.group("ssm_proj").total_s == pytest.approx(36 * sum(k.s for k in proj if k is not None))


def test_sliding_window_layers_are_looked_up_over_their_window():
    m = measured(gpu="h200", model="gpt-oss-120b", tp=4)  # 36 layers, every other one a 128-token window
    tables = tables_for("h200")
    step = m.step_time_of(shape((1000, 3000), *[(1, 2047)] * 20))
    assert step.group("prefill_attention").total_s == pytest.approx(18 * (
        s_of(tables.context_attention(1, 1000, 3000, 16, 2, 64, 2))
        + s_of(tables.context_attention(1, 1000, 0, 16, 2, 64, 2, window=128))
    ))  # fmt: skip
    assert step.group("decode_attention").total_s == pytest.approx(18 * (
        s_of(tables.generation_attention(20, 2048, 16, 2, 64, 2))
        + s_of(tables.generation_attention(20, 2048, 16, 2, 64, 2, window=128))
    ))  # fmt: skip


def test_deepeps_all_to_alls_are_the_tables_where_they_hold_the_ranks_and_nodes():
    def pool(ep: int) -> MeasuredKernels:
        cfg = make_config(COLLOCATED, target={"time_model": "measured", "model": "deepseek-v3"},
                          pools={"mixed": {"gpu": "h200", "ep": ep, "dp_attention": True}})  # fmt: skip
        m = time_model_for(cfg, cfg.pools.mixed)
        assert isinstance(m, MeasuredKernels)
        return m

    one_node, tables = pool(8), tables_for("h200")  # DeepSeek-V3: 58 MoE layers, top 8 of 256, hidden 7,168

    def deepep(x: int, low_latency: bool) -> float:
        return sum(
            s_of(tables.deepep(x, p, low_latency, 7168, 8, 256, 8, 1)) for p in ("dispatch", "combine")
        )

    prefill, decode = shape((4096, 0)), shape(*[(1, 2047)] * 64)
    assert one_node.step_time_of(prefill).all_to_all_s == pytest.approx(58 * deepep(512, False))
    step = one_node.step_time_of(decode)
    assert step.all_to_all_s == pytest.approx(58 * deepep(8, True))
    elementwise = step.group("elementwise").total_s  # the package's formula: no table
    assert step.measured_s == pytest.approx(step.gpu_s - elementwise)
    two_nodes = pool(16)  # never measured: the per-operator model's all-to-all, not counted measured
    step = two_nodes.step_time_of(decode)
    ops = OperatorRoofline(two_nodes.model, two_nodes.gpu, 1, experts=two_nodes.experts).step_time_of(decode)
    assert step.all_to_all_s == ops.all_to_all_s > 0
    elementwise = step.group("elementwise").total_s
    assert step.measured_s == pytest.approx(step.gpu_s - step.all_to_all_s - elementwise)


def test_what_the_tables_lack_keeps_its_roofline_and_is_not_counted_measured():
    # DBRX's experts (6,144 x 10,752, top 4 of 16) were never measured; its attention and router were.
    m = measured(model="dbrx", tp=8)
    mixed = shape((512, 0), *[(1, 1000)] * 8)
    step = m.step_time_of(mixed)
    ops = OperatorRoofline(m.model, m.gpu, 8, experts=m.experts).step_time_of(mixed)
    routed = step.group("routed_experts")
    assert not isinstance(routed, MeasuredGroupTime) and routed.measured_s == 0
    assert routed.total_s == ops.group("routed_experts").total_s
    for name in ("qkv_o", "prefill_attention", "decode_attention", "shared_experts"):
        assert isinstance(step.group(name), MeasuredGroupTime)
    assert 0 < step.measured_s < step.gpu_s
    assert step.measured_s == pytest.approx(step.gpu_s - routed.total_s - step.group("elementwise").total_s)


def test_a_window_of_decode_steps_gets_the_bits_single_steps_get():
    m = measured()
    decodes = shape(*[(1, 900 + 37 * i) for i in range(48)])
    window = m.step_time_of(decode_steps(decodes, 400))
    single = [m.step_time_of(decode_step(decodes, i)) for i in range(400)]
    assert np.array_equal(window.total_s, [s.total_s for s in single])
    assert np.array_equal(window.measured_s, [s.measured_s for s in single])
    assert np.all(np.diff(window.total_s) >= 0)  # each step reads more KV


def test_decode_attention_is_the_table_on_its_grid_and_linear_between():
    m = measured()
    tables = tables_for("h100-sxm")

    def at(kv: int) -> float:
        return m.step_time_of(shape(*[(1, kv - 1)] * 16)).group("decode_attention").total_s

    def table(kv: int) -> float:
        k = tables.generation_attention(16, kv, 28, 4, 128, 2)
        assert k is not None
        return 28 * k.s

    assert at(40) == pytest.approx(table(40))  # every length below 64 is a grid point
    assert at(4096) == pytest.approx(table(4096))
    assert at(4096 + 64) == pytest.approx((table(4096) + table(4096 + 128)) / 2)  # the grid: 128 apart


def test_the_weight_gemms_are_the_tables_on_the_token_grid_and_linear_between():
    m = measured()
    tables, h = tables_for("h100-sxm"), 3584

    def at(t: int) -> tuple[float, float]:
        step = m.step_time_of(shape((t, 0)))
        return step.group("mlp").total_s, step.group("elementwise").total_s

    def table(t: int) -> tuple[float, float]:
        mlp = [tables.gemm(t, 2 * 18944, h, "bf16"), tables.gemm(t, h, 18944, "bf16")]
        norms, act = tables.elementwise(t, 2 * h, 2 * h), tables.elementwise(t, 2 * 18944, 18944)
        return 28 * sum(s_of(k) for k in mlp), 56 * norms.s + 28 * act.s

    assert at(37) == pytest.approx(table(37))  # every count below 64 is a grid point
    assert at(4096) == pytest.approx(table(4096))
    lo, hi = table(4096), table(4096 + 128)  # the grid: 128 apart
    assert at(4096 + 32) == pytest.approx((0.75 * lo[0] + 0.25 * hi[0], 0.75 * lo[1] + 0.25 * hi[1]))
    assert abs(at(4096 + 32)[0] - table(4096 + 32)[0]) < 0.01 * table(4096 + 32)[0]  # the tables' own curve


def test_a_gpu_without_tables_is_refused_unless_the_roofline_may_stand_in():
    refused = r"pools.mixed.gpu='h800' has no vllm current kernel tables.*measured_fallback: roofline$"
    with pytest.raises(ConfigError, match=refused):
        make_config(COLLOCATED, target={"time_model": "measured"}, pools={"mixed": {"gpu": "h800"}})
    cfg = make_config(COLLOCATED, target={"time_model": "measured", "measured_fallback": "roofline"},
                      pools={"mixed": {"gpu": "h800"}})  # fmt: skip
    assert type(time_model_for(cfg, cfg.pools.mixed)) is OperatorRoofline


def test_the_measured_model_takes_its_own_cpu_time_a_step_unless_one_is_set():
    def s_per_step(**target) -> float:
        cfg = make_config(COLLOCATED, target=target, pools={"mixed": {"gpu": "h100-sxm"}})
        written = config_to_dict(cfg)["target"]["cpu_overhead"]["s_per_step"]
        assert written == cfg.target.cpu_overhead.s_per_step  # the run's written config shows it
        return time_model_for(cfg, cfg.pools.mixed).step_time_of(StepShape()).cpu_s

    assert s_per_step(time_model="measured") == MEASURED_S_PER_STEP == s_per_step()  # unset: measured
    assert s_per_step(time_model="measured", cpu_overhead={"s_per_step": 0.002}) == 0.002
    assert s_per_step(time_model="operators") == CpuOverhead().s_per_step == 0.002


def test_a_run_says_how_much_of_its_step_time_was_measured_and_from_which_tables():
    cfg = make_config(
        PD,
        workload={"num_requests": 6, "prompt_len": 600, "output_len": 24, "rate": 4.0},
        target={"time_model": "measured", "measured_fallback": "roofline"},
        pools={"prefill": {"gpu": "h100-sxm"}, "decode": {"gpu": "h800"}},
    )
    out = run_virtual(cfg)
    assert out.summary["completed"] == 6
    share = out.summary["measured_share_by_role"]
    assert share["decode"] == 0.0 and 0.8 < share["prefill"] < 1.0  # all but the element-wise kernels
    assert out.summary["measured_coverage"] == (
        "measured: share of step time from measured kernels: "
        f"prefill {100 * share['prefill']:.0f} % (vllm 0.24.0 tables, h100-sxm), "
        "decode 0 % (no vllm tables for h800: operators roofline)"
    )


def test_an_afd_pool_under_measured_runs_its_pipeline_on_the_rooflines_and_says_so():
    from cluster.outcome import tables_line
    from emulation.afd_layout import AfdLayout
    from tests.test_afd import AFD_DSV3

    cfg = make_config(AFD_DSV3, target={"time_model": "measured"}, pools={"mixed": {"gpu": "h100-sxm"}})
    assert isinstance(time_model_for(cfg, cfg.pools.mixed), AfdLayout)
    assert tables_line(cfg, cfg.pools.mixed) == "AFD: its pipeline's rooflines"
