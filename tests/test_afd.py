"""Attention-FFN disaggregation's arithmetic: the bytes across the cut and the ping-pong pipeline, by
hand (emulation/afd.py)."""

from __future__ import annotations

import math
import re

import pytest

from emulation.afd import cut_bytes_per_token, min_micro_batches, pipeline
from emulation.profiles import MODELS


def test_deepseek_v3_moves_1_59_mib_a_token_a_pass_24_times_its_kv():
    """58 MoE layers x 7,168 hidden x 2 B out and 2 B back = 1,662,976 B = 1.59 MiB, against 70,272 B
    (69 KiB) of KV a token."""
    dsv3 = MODELS["deepseek-v3"]
    moved = cut_bytes_per_token(dsv3)
    assert moved == 58 * 7168 * 4 == 1_662_976
    assert moved / 2**20 == pytest.approx(1.59, abs=0.005)
    assert dsv3.kv_bytes_per_token / 2**10 == pytest.approx(69, abs=0.7)
    assert moved / dsv3.kv_bytes_per_token == pytest.approx(24, abs=0.5)
    # Step-3's way: FP8 out with the 8 expert choices, BF16 back
    assert cut_bytes_per_token(dsv3, a2f_bytes=1, routing=True) == 58 * (7168 * 3 + 8 * 8)


def test_a_dense_model_has_no_cut():
    with pytest.raises(AssertionError, match="no experts"):
        cut_bytes_per_token(MODELS["qwen2.5-7b"])


# T_a = 3, T_e = 2, T_c = 1 (ms) over L = 4 layers: T_f = 3, R = 3 + 1 + 2 + 1 = 7, 2(1 + 1/3) = 2.67
@pytest.mark.parametrize(
    ("m", "total", "comm"),
    [
        (1, 4 * 7, 4 * 2),  # C = max(3, 7) = 7: T = 3·7 + 0 + 7 = 28; without the link R = 5: 20
        (2, 3 * 7 + 3 + 7, 3 + 2),  # C = max(6, 7) = 7: 31; no link: C = max(6, 5) = 6, 3·6 + 3 + 5 = 26
        (3, 3 * 9 + 6 + 7, 2),  # C = 9 (m >= 2.67): 40 = (3·4 - 1)·3 + 7; no link: 27 + 6 + 5 = 38
        (4, 3 * 12 + 9 + 7, 2),  # C = 12: 52 = (4·4 - 1)·3 + 7; no link: 50
    ],
)
def test_the_ping_pong_pipeline_by_hand(m, total, comm):
    t = pipeline(3.0, 2.0, 1.0, m, 4)
    assert t.total_s == total and t.communication_s == comm
    assert t.attention_s == m * 4 * 3 and t.ffn_s == m * 4 * 2
    assert t.attention_bubble_s == total - m * 12 and t.ffn_bubble_s == total - m * 8
    if m >= min_micro_batches(3.0, 2.0, 1.0):  # MegaScale-Infer's closed form holds from here
        assert t.total_s == (3 + 2 + 2 * 1) + 3 * (m * 4 - 1)


def test_a_balanced_pipeline_keeps_both_sides_busy_but_for_its_fill():
    """T_a = T_e: with enough micro-batches each side idles only while the pipeline fills and drains."""
    t = pipeline(2.0, 2.0, 0.5, 4, 10)
    assert t.attention_bubble_s == t.ffn_bubble_s == 2.0 + 2 * 0.5
    slow_link = pipeline(2.0, 2.0, 3.0, 4, 10)  # the link the busiest stage: the step follows it
    assert slow_link.total_s == (4 * 10 - 1) * 3.0 + (2 + 2 + 6)


def test_a_slower_way_back_sets_the_round_trip_and_the_stage():
    """FP8 out (T_c 1), BF16 back (2): R = 3 + 1 + 2 + 2 = 8, stage 3; m = 2 over 4 layers:
    C = max(6, 8) = 8, T = 3·8 + 3 + 8 = 35; no link: 26 (as above)."""
    t = pipeline(3.0, 2.0, 1.0, 2, 4, f2a_s=2.0)
    assert t.total_s == 35 and t.communication_s == 35 - 26


def _layout(num_attention: int, num_ffn: int = 1, micro_batches: int = 3, **afd):
    from emulation.afd_layout import AfdLayout
    from emulation.config import AfdConfig
    from emulation.profiles import GPUS, LinkProfile

    config = AfdConfig(
        num_attention_ranks=num_attention, num_ffn_ranks=num_ffn, ffn_ep=afd.pop("ffn_ep", 32),
        link="test", link_bandwidth=1.0, num_micro_batches=micro_batches, **afd,
    )  # fmt: skip
    link = LinkProfile("test", link_gbps=400.0, latency_s=20e-6, per_transfer_overhead_s=1.0)
    return AfdLayout(MODELS["deepseek-v3"], GPUS["h800"], GPUS["h800"], config, link)


def _decodes(num: int, context: int = 4095):
    from emulation.step_shape import StepItem, StepShape

    return StepShape.of([StepItem(1, context, True)] * num)


def test_an_afd_step_is_the_pipeline_of_its_sides_plus_what_runs_outside_it():
    """8 attention ranks of 64 decodes (the engine's step: 512), 2 micro-batches, 2 FFN ranks of 16
    GPUs: T_a from one rank's micro-batch (32 decodes) through the attention groups, a layer's share;
    T_e from the FFN rank's experts at the 4 x 32 tokens it serves; T_c the slower end's NICs (the
    attention rank's one NIC: 32 x 7,168 x 2 B at 50 GB/s, over the FFN rank's 16 for 128 tokens),
    the link's latency but not its per-transfer overhead. The step: pipeline(T_a, T_e, T_c) plus the
    dense layers, LM head and CPU."""
    from emulation.config import PoolConfig
    from emulation.expert_parallel import ExpertParallel
    from emulation.operators import OperatorRoofline
    from emulation.profiles import GPUS
    from emulation.step_shape import share_of

    dsv3, h800 = MODELS["deepseek-v3"], GPUS["h800"]
    layout = _layout(num_attention=8, num_ffn=2, micro_batches=2, ffn_ep=16)
    step = layout.step_time_of(_decodes(8 * 64))
    micro = _decodes(32)
    side = {g.name: g.total_s for g in OperatorRoofline(dsv3, h800).groups(micro)}
    t_a = (side["qkv_o"] + side["decode_attention"]) / 61
    assert step.attention_layer_s == pytest.approx(t_a)
    assert step.a2f_s == pytest.approx(20e-6 + 32 * 7168 * 2 / 50e9)
    ffn_rank = ExpertParallel(dsv3, h800, PoolConfig(replicas=1, ep=16, dp_attention=True))
    ffn = OperatorRoofline(dsv3, h800, 1, experts=ffn_rank)
    groups = ffn.expert_groups(share_of(_decodes(128), 16), ffn_rank.routed(128))
    t_e = (sum(g.total_s for g in groups) + ffn_rank.all_to_all_s(128)) / 58
    assert step.ffn_layer_s == pytest.approx(t_e)
    wire_s = 32 * 7168 * 2 / 50e9  # the link's latency: in the round trip, not the stage
    expected = pipeline(t_a, t_e, wire_s, 2, 58, f2a_s=wire_s, latency_s=20e-6)
    assert step.pipeline.total_s == pytest.approx(expected.total_s)
    cpu_s = 0.002 + 1.4e-5 * 64
    outside = 2 * (side["mlp"] + side["logits"] + 3 * t_a) + cpu_s
    assert step.outside_s == pytest.approx(outside) and step.overhead_s == pytest.approx(cpu_s)
    assert step.total_s == pytest.approx(expected.total_s + outside)
    assert step.a2f_bytes == step.f2a_bytes == 512 * 7168 * 2 * 58  # all ranks', all layers


def test_the_barrier_waits_for_the_slowest_attention_rank_an_ffn_rank_serves():
    """With barrier_jitter 0.1 each layer's T_a is the expected slowest of the A/F = 4 ranks an FFN rank
    serves: x (1 + 0.1 x 1.0294), E[max of 4 standard normals] = 1.0294 (tables of normal order
    statistics), of 2: 1/sqrt(pi)."""
    from emulation.afd_layout import expected_max_of_normals

    assert expected_max_of_normals(1) == 0.0
    assert expected_max_of_normals(4) == pytest.approx(1.0294, abs=1e-4)
    assert expected_max_of_normals(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)
    shape = _decodes(8 * 64)
    calm = _layout(8, 2, barrier_jitter=0.0).step_time_of(shape)
    jittery = _layout(8, 2, barrier_jitter=0.1).step_time_of(shape)
    assert jittery.attention_layer_s == pytest.approx(calm.attention_layer_s * (1 + 0.1 * 1.0294), rel=1e-4)
    assert jittery.total_s > calm.total_s
    # the wait is the attention rank's idle time, not its work
    assert jittery.pipeline.attention_s == pytest.approx(calm.pipeline.attention_s)
    assert jittery.pipeline.attention_bubble_s == pytest.approx(
        jittery.total_s - jittery.outside_s - calm.pipeline.attention_s
    )


def test_a_window_of_decode_steps_times_as_its_steps_one_at_a_time():
    """Virtual mode times a steady stretch of decode steps as arrays (`decode_steps`): bit for bit the
    steps' own times."""
    from emulation.step_shape import decode_step, decode_steps

    layout, shape = _layout(8, 2, ffn_ep=16), _decodes(8 * 16, context=1000)
    window = layout.step_time_of(decode_steps(shape, 5)).total_s
    assert list(window) == [layout.step_time_of(decode_step(shape, i)).total_s for i in range(5)]


def test_too_few_attention_ranks_starve_the_experts_too_many_saturate_them():
    """One FFN rank of 32 H800s (8 experts a GPU), 64 decodes at 4k context an attention rank, 3 micro-
    batches, FP8 out: with few attention ranks each micro-batch's experts read their weights for a few
    tokens (T_e hardly moves from 4 to 32 ranks) and tokens a second per GPU are low; past the optimum
    the experts' work and the FFN NICs grow with A, attention idles and per-GPU output falls."""
    steps = {a: _layout(a, a2f_dtype="fp8").step_time_of(_decodes(64 * a)) for a in (4, 32, 128, 512)}
    per_gpu = {a: 64 * a / step.total_s / (a + 32) for a, step in steps.items()}
    assert per_gpu[4] < 0.3 * per_gpu[128] and per_gpu[512] < 0.6 * per_gpu[128]
    assert steps[32].ffn_layer_s < 1.25 * steps[4].ffn_layer_s  # weight reads: starved experts
    assert steps[512].ffn_layer_s > 2.5 * steps[128].ffn_layer_s  # saturated experts
    assert steps[512].a2f_s - 20e-6 == pytest.approx(4 * (steps[128].a2f_s - 20e-6))  # the FFN NICs
    idle = {a: s.pipeline.attention_bubble_s / s.pipeline.total_s for a, s in steps.items()}
    assert idle[512] > idle[128] > idle[4]


AFD_DSV3 = {
    "target": {"model": "deepseek-v3", "time_model": "operators"},
    "scheduler": {"block_size": 64, "max_num_batched_tokens": 8192},
    "pools": {
        "mixed": {
            "replicas": 1,
            "gpu": "h800",
            "afd": {"num_attention_ranks": 8, "num_ffn_ranks": 2, "ffn_ep": 16, "link": "rdma-400g"},
        }
    },
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"pools": {"mixed": {"afd": {"num_ffn_ranks": 3}}}},
            "pools.mixed.afd.num_ffn_ranks=3: num_attention_ranks=8 is not a multiple of it (each FFN rank "
            "serves A/F consecutive attention ranks, as vLLM's AFD plugin requires); allowed: 1, 2, 4, 8",
        ),
        (
            {
                "target": {"model": "qwen2.5-7b"},
                "scheduler": {"block_size": 16},
                "pools": {"mixed": {"gpu": "l40s"}},
            },
            "pools.mixed.afd: target.model='qwen2.5-7b' is dense (no experts to put on FFN ranks); allowed: "
            "no afd, or a mixture-of-experts target (deepseek-v3, ",
        ),
        (
            {"pools": {"mixed": {"afd": {"link": None}}}},
            "pools.mixed.afd.link=None: hidden states cross to the FFN ranks and back at every MoE layer "
            "over this link; allowed: pcie4-x16, rdma-400g, nvlink",
        ),
        (
            {"pools": {"mixed": {"afd": {"ffn_ep": 4}}}},
            "pools.mixed.afd.ffn_ep=4: deepseek-v3's experts take 166.1 GB on each of an FFN rank's 4 x "
            "ffn_tp=1 h800s, more than their 72.0 GB; allowed: a larger ffn_ep or ffn_tp",
        ),
        (
            {"pools": {"mixed": {"ep": 8}}},
            "pools.mixed.ep=8: with afd the experts are on the FFN ranks; allowed: the default",
        ),
        (
            {"pools": {"mixed": {"tp": 16}}},
            "pools.mixed.tp=16: a tensor-parallel group's GPUs share a node of 8; allowed: at most 8",
        ),
        (
            {"runner": {"compute": "real"}},
            "runner.architecture='qwen2': pools.mixed.afd sends each MoE layer's hidden states to the FFN "
            "ranks, and this runner model has no experts",
        ),
        (
            {"pools": {"encoder": {"afd": {"link": "nvlink"}}}},
            "pools.encoder.afd: the vision encoder has no experts to disaggregate; allowed: none (unset)",
        ),
        (
            {"target": {"time_model": "aggregate"}},
            "pools.mixed.afd: target.time_model='aggregate' times a step as a whole; allowed: operators",
        ),
    ],
)
def test_a_bad_afd_config_is_one_line_naming_field_value_and_what_is_allowed(change, message):
    from cluster.config_load import ConfigError
    from tests.factories import make_config

    assert make_config(AFD_DSV3).pools.mixed.num_gpus == 8 + 2 * 16
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}") as e:
        make_config(AFD_DSV3, change)
    assert "\n" not in str(e.value)


def test_dispatch_to_the_experts_gpus_sends_a_copy_a_distinct_gpu_and_no_all_to_all_inside():
    """MegaScale-Infer's M2N: a token goes to each of the FFN rank's 16 GPUs holding one of its 8
    experts (16 x (1 - C(240, 8) / C(256, 8)) = 6.52 of them), and the FFN rank runs no all-to-all."""
    from emulation.all_to_all import distinct_holders_per_token

    shape = _decodes(8 * 64)
    rank, expert = (_layout(8, 2, ffn_ep=16, dispatch=d).step_time_of(shape) for d in ("rank", "expert"))
    copies = distinct_holders_per_token(256, 8, 16)
    assert copies == pytest.approx(6.52, abs=0.01)
    assert expert.a2f_bytes == pytest.approx(rank.a2f_bytes * copies)
    assert expert.a2f_s == pytest.approx(20e-6 + 64 / 3 * copies * 7168 * 2 / 50e9)  # the attention NIC
    ffn = _layout(8, 2, ffn_ep=16)._ffn
    assert ffn.experts is not None
    inside_s = ffn.experts.all_to_all_s(4 * 64 / 3) / 58
    assert rank.ffn_layer_s - expert.ffn_layer_s == pytest.approx(inside_s) and inside_s > 0


def test_tensor_parallel_attention_all_reduces_its_output_once_a_moe_layer_inside_t_a():
    """Attention ranks of 2 GPUs: a MoE layer's attention output is all-reduced before it crosses
    (inside T_a); its MLP output comes back whole. A dense layer all-reduces twice, outside the pipeline."""
    from emulation.afd_layout import AfdLayout
    from emulation.operators import OperatorRoofline
    from emulation.profiles import GPUS

    one = _layout(8, 2, micro_batches=2, ffn_ep=16)
    two = AfdLayout(one.model, one.attention_gpu, one.ffn_gpu, one.afd, one.link, attention_tp=2)
    step = two.step_time_of(_decodes(8 * 64))
    attention = OperatorRoofline(MODELS["deepseek-v3"], GPUS["h800"], 2)
    micro = _decodes(32)
    per_all_reduce = attention.all_reduce_s(32) / (2 * 61)
    assert per_all_reduce > 0
    side = {g.name: g.total_s for g in attention.groups(micro)}
    t_a = (side["qkv_o"] + side["decode_attention"]) / 61 + per_all_reduce
    assert step.attention_layer_s == pytest.approx(t_a)
    dense = 3 * (t_a + per_all_reduce)
    assert step.outside_s == pytest.approx(2 * (side["mlp"] + side["logits"] + dense) + step.cpu_s)


def test_the_links_latency_lengthens_each_round_trip_not_the_stage():
    """T_a 3, T_e 2, wire 1 each way, latency 0.5, m = 2 over 4 layers: R = 3 + 1 + 2 + 1 + 2 x 0.5 = 8,
    the stage max(3, 2, 1) = 3: C = max(6, 8) = 8, T = 3·8 + 3 + 8 = 35 (without the latency: 31)."""
    assert pipeline(3.0, 2.0, 1.0, 2, 4, latency_s=0.5).total_s == 35
    assert pipeline(3.0, 2.0, 1.0, 2, 4).total_s == 31


def test_a_rank_with_fewer_requests_than_micro_batches_runs_one_a_request():
    """m = 3 asked: 8 ranks of 1 decode run 1 micro-batch, of 2 decodes 2, of 64 all 3; a lone decode's
    experts still compute its token (routed work never rounds to nothing)."""
    layout = _layout(8, 2, micro_batches=3, ffn_ep=16)
    runs = {n: layout.step_time_of(_decodes(8 * n)) for n in (1, 2, 64)}
    assert [runs[n].num_micro_batches for n in (1, 2, 64)] == [1, 2, 3]
    lone = layout.step_time_of(_decodes(1))
    assert lone.num_micro_batches == 1 and lone.expert_load is not None
    assert lone.expert_load.num_tokens == 1 and lone.expert_load.rank_tokens > 0


def test_an_ffn_rank_serves_the_busiest_attention_rank_and_its_share_of_the_rest():
    """8 attention ranks, 2 FFN ranks; a 2,000-token prompt chunk beside 512 decodes: the chunk's rank is
    the busiest (2,000 of 2,512 tokens), the other 3 ranks its FFN rank serves hold 3/7 of the rest:
    2,000 + 512 x 3/7 = 2,219.4 tokens, over 3 micro-batches 740 each."""
    from emulation.step_shape import StepItem, StepShape

    shape = StepShape.of([StepItem(2000, 0, True), *[StepItem(1, 4095, True)] * 512])
    step = _layout(8, 2, micro_batches=3, ffn_ep=16).step_time_of(shape)
    assert step.expert_load is not None and step.expert_load.num_tokens == math.ceil((2000 + 512 * 3 / 7) / 3)
