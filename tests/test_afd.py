"""Attention-FFN disaggregation's arithmetic: the bytes across the cut and the ping-pong pipeline, by
hand (emulation/afd.py)."""

from __future__ import annotations

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


def _layout(num_attention: int, num_ffn: int = 4, micro_batches: int = 3):
    from emulation.afd import AfdLayout
    from emulation.profiles import GPUS

    return AfdLayout(
        MODELS["deepseek-v3"], GPUS["h800"], GPUS["h800"], num_attention, num_ffn,
        link_bytes_per_s=50e9, link_latency_s=20e-6, num_micro_batches=micro_batches,
    )  # fmt: skip


def test_an_afd_step_is_the_pipeline_of_its_sides_plus_what_runs_outside_it():
    """T_a from the attention side's groups (a layer's share), T_e from the FFN rank's expert groups at
    A/F attention ranks' tokens, T_c from the bytes its NIC takes: the step is pipeline(T_a, T_e, T_c)
    plus the dense layers, LM head and CPU, once a micro-batch."""
    from emulation.operators import OperatorRoofline
    from emulation.profiles import GPUS
    from emulation.step_shape import StepItem, StepShape, share_of

    layout = _layout(num_attention=8, num_ffn=2, micro_batches=2)
    shape = StepShape.of([StepItem(1, 4095, True)] * 64)
    step = layout.step_time_of(shape)
    micro = share_of(shape, 2)
    side = {g.name: g.total_s for g in OperatorRoofline(MODELS["deepseek-v3"], GPUS["h800"]).groups(micro)}
    t_a = (side["qkv_o"] + side["decode_attention"]) / 61
    assert step.attention_layer_s == pytest.approx(t_a)
    assert step.a2f_s == pytest.approx(20e-6 + 4 * 32 * 7168 * 2 / 50e9)  # 4 attention ranks a FFN rank
    expected = pipeline(t_a, step.ffn_layer_s, step.a2f_s, 2, 58, f2a_s=step.f2a_s)
    assert step.pipeline == expected
    cpu_s = 0.002 + 1.4e-5 * 64
    outside = 2 * (side["mlp"] + side["logits"] + 3 * t_a) + cpu_s
    assert step.outside_s == pytest.approx(outside) and step.total_s == pytest.approx(
        expected.total_s + outside
    )


def test_too_few_attention_ranks_starve_the_experts_too_many_make_attention_wait():
    """32 FFN ranks (8 experts a GPU), 32 decodes at 4k context a attention rank, 3 micro-batches: with
    as many attention ranks as FFN ranks the experts read their weights for a few tokens each (tokens a
    second per GPU low); at 8:1 they compute far more for the same reads; at 32:1 the experts' GEMMs and
    the FFN NICs (taking 32 attention ranks' streams) bind, attention waits and per-GPU output falls."""
    from emulation.step_shape import StepItem, StepShape

    shape = StepShape.of([StepItem(1, 4095, True)] * 32)
    steps = {a: _layout(num_attention=a, num_ffn=32).step_time_of(shape) for a in (32, 256, 1024)}
    per_gpu = {a: a * 32 / step.total_s / (a + 32) for a, step in steps.items()}
    assert per_gpu[256] > 1.5 * per_gpu[32] and per_gpu[256] > 1.2 * per_gpu[1024]
    attention_busy = {a: step.pipeline.attention_s / step.pipeline.total_s for a, step in steps.items()}
    assert attention_busy[1024] < 0.6 * attention_busy[256]
    assert steps[1024].ffn_layer_s > steps[256].ffn_layer_s and steps[1024].a2f_s > 2 * steps[256].a2f_s
