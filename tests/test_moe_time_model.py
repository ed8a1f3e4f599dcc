"""Mixture-of-experts targets in both time models: each MoE group's FLOPs and bytes pinned by hand for
DeepSeek-V3 (MLA, FP8) and Qwen3-30B-A3B, expert coverage, one all-to-all's bytes, and what expert
parallelism, routing skew, redundant experts and dual-batch overlap do to a step."""

from __future__ import annotations

import math
import re

import pytest

from cluster.config_load import ConfigError, build_config
from emulation.config import EpFabricConfig, MoeRoutingConfig, PoolConfig
from emulation.expert_parallel import ExpertParallel, weight_bytes_per_gpu
from emulation.kv_cache import kv_capacity_tokens
from emulation.operators import OperatorRoofline
from emulation.profiles import GPUS, MODELS
from emulation.roofline import Roofline
from emulation.step_shape import StepItem, StepShape, decode_step, decode_steps

DSV3, QWEN3 = MODELS["deepseek-v3"], MODELS["qwen3-30b-a3b"]
H800 = GPUS["h800"]
# DeepSeek-V3: hidden 7,168, routed experts 256 x (3 x 7,168 x 2,048), top-8, 58 MoE layers (61 - 3 dense)
DSV3_EXPERT = 3 * 7168 * 2048
# Qwen3-30B-A3B: hidden 2,048, 128 experts of 3 x 2,048 x 768, top-8, 48 MoE layers, BF16
QWEN3_EXPERT = 3 * 2048 * 768


def operators(model, pool=None, routing=None, fabric=None) -> OperatorRoofline:
    """The per-operator model of one replica of `pool` (default: one H800) at its default efficiencies."""
    pool = pool or PoolConfig(replicas=1, gpu="h800")
    gpu = GPUS[pool.gpu]
    return OperatorRoofline(
        model, gpu, pool.attention_tp, experts=ExpertParallel(model, gpu, pool, routing, fabric)
    )


def test_mla_caches_576_values_a_layer_whole_on_every_tensor_parallel_rank():
    """(512 + 64) values x 2 B x 61 layers = 70,272 B a token (DeepSeek's ISCA'25 paper, table 1:
    70.272 KB), replicated on each TP rank (one latent for all heads)."""
    assert DSV3.kv_bytes_per_token == 61 * (512 + 64) * 2 == 70_272
    assert DSV3.kv_bytes_per_token_per_gpu(8) == 70_272
    assert QWEN3.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2


@pytest.mark.parametrize(
    ("model", "num_experts", "expected"),
    [
        ("deepseek-v3", 256, {1: 8.0, 8: 57.42083, 64: 222.44249, 1024: 256.0}),  # 256 (1 - (31/32)^T)
        ("qwen3-30b-a3b", 128, {1: 8.0, 8: 51.61991, 64: 125.94235, 1024: 128.0}),  # 128 (1 - (15/16)^T)
    ],
)
def test_experts_a_step_touches_under_uniform_routing(model, num_experts, expected):
    experts = ExpertParallel(MODELS[model], H800, PoolConfig(replicas=1))
    for num_tokens, touched in expected.items():
        assert experts.placement.load(num_tokens).experts_touched == pytest.approx(touched, rel=1e-6)
        assert experts.placement.load(num_tokens).experts_touched <= num_experts


def test_tokens_per_expert_are_ranks_times_batch_times_top_k_over_experts():
    """48 DP attention ranks x 32 decode tokens on DeepSeek-V3's routing (256 experts, top-8, 288 slots
    with 32 redundant): 48 x 32 x 8 / 256 = 48 tokens per expert."""
    pool = PoolConfig(replicas=1, gpu="h800", ep=48, dp_attention=True, num_redundant_experts=32)
    model = operators(DSV3, pool)
    step = model.step_time_of(StepShape.of([StepItem(1, 2048, True)] * 48 * 32))
    assert step.expert_load is not None and step.expert_load.mean_tokens_per_expert == 48.0
    assert step.expert_load.num_tokens == 48 * 32


@pytest.mark.parametrize("num_tokens", [1, 8, 64, 1024])
def test_deepseek_v3_groups_by_hand_on_one_gpu(num_tokens):
    """A step of `num_tokens` decodes at 1,023 cached tokens on one H800 (ep 1, tp 1)."""
    step = operators(DSV3).step_time_of(StepShape.of([StepItem(1, 1023, True)] * num_tokens))
    t = num_tokens
    touched = 256 * (1 - (31 / 32) ** t)
    routed = step.group("routed_experts")
    assert routed.flops == pytest.approx(2 * DSV3_EXPERT * t * 8 * 58)  # FLOPs of top-8 assignments
    # FP8: 1 byte a weight; each assignment's activations (in, gate/up, act, out: 2 x 7,168 + 3 x 2,048
    # values in BF16) go through HBM once a layer's exceed the 50 MB L2 (1,024 tokens: 335 MB)
    activations = 8 * t * (2 * 7168 + 3 * 2048) * 2
    spilled = activations * 58 if activations > 50e6 else 0
    assert routed.bytes == pytest.approx(touched * DSV3_EXPERT * 1 * 58 + spilled)
    shared = step.group("shared_experts")  # 1 shared expert of 2,048 + the router, every token
    assert shared.flops == pytest.approx(2 * (3 * 7168 * 2048 + 7168 * 256) * t * 58)
    assert shared.bytes == pytest.approx((3 * 7168 * 2048 + 7168 * 256) * 58)
    assert step.group("mlp").flops == pytest.approx(2 * 3 * 7168 * 18432 * t * 3)  # 3 dense layers
    # MLA: q down (+ norm) and up, KV down with the rotary key (+ norm), KV up, output
    attn = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168
    assert step.group("qkv_o").flops == pytest.approx(2 * 61 * attn * t)
    # absorbed decode: each head a 576-wide key and 512-wide value, over all 1,024 keys
    assert step.group("decode_attention").flops == pytest.approx(61 * 128 * (2 * 576 + 2 * 512) * 1024 * t)
    assert step.group("decode_attention").bytes == pytest.approx(70_272 * 1024 * t)
    # the GEMMs of FP8 weights run at the FP8 peak
    assert routed.compute_s == pytest.approx(routed.flops / (1979e12 * 0.47))


def test_mla_prefill_attends_up_projected_and_up_projects_its_cached_context():
    """A 512-token chunk after 1,024 cached tokens: per key and head 2 x (128 + 64) + 2 x 128 FLOPs,
    plus the latent of each cached token up-projected to K and V (2 x 512 x 128 x (128 + 128))."""
    step = operators(DSV3).step_time_of(StepShape.of([StepItem(512, 1024, True)]))
    keys = 512 * 1024 + 512 * 513 // 2
    expected = 61 * 128 * (2 * 192 + 2 * 128) * keys + 61 * 2 * 512 * 128 * 256 * 1024
    assert step.group("prefill_attention").flops == pytest.approx(expected)
    assert step.group("prefill_attention").bytes == pytest.approx(70_272 * (1024 + 512))


@pytest.mark.parametrize("num_tokens", [1, 8, 64, 1024])
def test_qwen3_30b_a3b_groups_by_hand(num_tokens):
    step = operators(QWEN3).step_time_of(StepShape.of([StepItem(1, 1023, True)] * num_tokens))
    t = num_tokens
    touched = 128 * (1 - (15 / 16) ** t)
    routed = step.group("routed_experts")
    assert routed.flops == pytest.approx(2 * QWEN3_EXPERT * t * 8 * 48)
    activations = 8 * t * (2 * 2048 + 3 * 768) * 2  # through HBM past H800's 50 MB L2 (1,024 tokens)
    spilled = activations * 48 if activations > 50e6 else 0
    assert routed.bytes == pytest.approx(touched * QWEN3_EXPERT * 2 * 48 + spilled)  # BF16
    assert step.group("shared_experts").flops == pytest.approx(2 * 2048 * 128 * t * 48)  # the router only
    assert step.group("mlp").flops == 0  # no dense layers
    assert step.group("qkv_o").flops == pytest.approx(2 * 48 * (2048 * (4096 + 1024) + 4096 * 2048) * t)
    assert step.group("decode_attention").flops == pytest.approx(4 * 32 * 128 * 48 * 1024 * t)
    assert routed.compute_s == pytest.approx(routed.flops / (989e12 * 0.47))  # BF16 peak


def test_one_all_to_all_moves_each_token_to_its_experts_ranks_and_nodes_once():
    """DeepSeek-V3 at EP 32 with DP attention on H800 nodes of 8 (4 nodes), 128 tokens a rank, FP8
    dispatch: a token's 8 experts fall on D = 32 (1 - Π_{i<8} (248 - i)/(256 - i)) = 7.2668 ranks and
    4 (1 - Π (192 - i)/(256 - i)) = 3.6142 nodes; the other 31/32 of the ranks' deliveries cross NVLink,
    the other 3/4 of the nodes' the NIC."""
    pool = PoolConfig(replicas=1, gpu="h800", ep=32, dp_attention=True)
    a2a = ExpertParallel(DSV3, H800, pool).all_to_all
    assert a2a is not None and a2a.num_nodes == 4
    up, out = a2a.bytes_sent(128, 1.0)
    d_ranks = 32 * (1 - math.prod((248 - i) / (256 - i) for i in range(8)))
    d_nodes = 4 * (1 - math.prod((192 - i) / (256 - i) for i in range(8)))
    assert (d_ranks, d_nodes) == (pytest.approx(7.2668, abs=1e-4), pytest.approx(3.6142, abs=1e-4))
    assert up == pytest.approx(128 * d_ranks * 31 / 32 * 7168) == pytest.approx(6_458_964, rel=1e-6)
    assert out == pytest.approx(128 * d_nodes * 3 / 4 * 7168) == pytest.approx(2_487_042, rel=1e-6)
    # latency + the slower link: 6.46 MB over 200 GB/s x 0.8 vs 2.49 MB over 50 GB/s x 0.8
    assert a2a.time_s(128, 1.0) == pytest.approx(25e-6 + 2_487_042 / 40e9, rel=1e-6)


def test_all_to_alls_across_nodes_are_bound_by_the_nics_once_a_token_reaches_several_nodes():
    """At EP 64 (8 nodes of 8 H800s) a token crosses to ~4.6 other nodes at 50 GB/s and to ~7.5 ranks
    through NVLink at 200 GB/s: the NICs bind. One scale-up domain of 64 GPUs needs no NIC."""
    pool = PoolConfig(replicas=1, gpu="h800", ep=64, dp_attention=True)
    tokens = 64 * 256
    nodes = ExpertParallel(DSV3, H800, pool).all_to_all_s(tokens)
    one_domain = ExpertParallel(DSV3, H800, pool, fabric=EpFabricConfig(gpus_per_node=64)).all_to_all_s(
        tokens
    )
    assert 0 < one_domain < nodes / 2


def test_the_busiest_rank_sets_the_step_and_skew_makes_it_busier():
    """Uniform routing still leaves one rank above the mean (a sum of random choices); a Zipf skew puts
    hot experts together and the busiest rank far above; EPLB's redundant copies of the hottest and its
    balanced packing bring it back to about uniform's. Where the experts' GEMMs are compute-bound
    (prompt chunks) the step follows."""

    def step(shape, routing=None, redundant=0):
        pool = PoolConfig(replicas=1, gpu="h800", ep=32, dp_attention=True, num_redundant_experts=redundant)
        return operators(DSV3, pool, routing=routing).step_time_of(shape)

    zipf = MoeRoutingConfig(skew="zipf", zipf_s=0.8)
    for shape in (
        StepShape.of([StepItem(1, 2048, True)] * 32 * 64),
        StepShape.of([StepItem(2048, 0, True)] * 32),
    ):
        uniform, skewed, balanced = step(shape), step(shape, zipf), step(shape, zipf, redundant=32)
        assert 1.0 < uniform.expert_load.imbalance < 1.3
        assert skewed.expert_load.imbalance > 1.5 * uniform.expert_load.imbalance
        assert balanced.expert_load.imbalance < 1.05 * uniform.expert_load.imbalance
        assert balanced.group("routed_experts").flops < skewed.group("routed_experts").flops / 1.5
    assert balanced.total_s < skewed.total_s  # prompt chunks: compute-bound experts


@pytest.mark.parametrize("ep", [32, 36, 72, 144])
def test_redundant_experts_leave_a_uniform_router_no_less_balanced(ep):
    """288 expert slots (256 + 32 copies) over ep ranks: as balanced as the copies' granularity allows
    (EP32: exactly as without copies)."""
    uniform = MoeRoutingConfig()
    plain = ExpertParallel(DSV3, H800, PoolConfig(replicas=1, ep=32, dp_attention=True), uniform)
    copies = ExpertParallel(
        DSV3, H800, PoolConfig(replicas=1, ep=ep, dp_attention=True, num_redundant_experts=32)
    )
    tokens = ep * 256
    if ep == 32:
        assert copies.placement.load(tokens).imbalance == pytest.approx(
            plain.placement.load(tokens).imbalance, rel=1e-3
        )
    # the best packing of 224 whole experts and 64 half ones: its busiest rank over the mean, and the
    # spread of the choices on top
    assert copies.placement.load(tokens).imbalance < 1.2 * plain.placement.load(tokens).imbalance


def test_dual_batch_overlap_hides_the_all_to_alls_under_compute_but_reads_the_weights_twice():
    shape = StepShape.of([StepItem(4096, 0, True)] * 32)
    off = PoolConfig(replicas=1, gpu="h800", ep=32, dp_attention=True)
    on = PoolConfig(replicas=1, gpu="h800", ep=32, dp_attention=True, enable_dbo=True)
    for model in (
        operators(DSV3, off),
        Roofline(DSV3, H800, 32, 0.47, 0.75, 0.0, ExpertParallel(DSV3, H800, off)),
    ):
        plain = model.step_time_of(shape)
        dbo = (
            operators(DSV3, on)
            if isinstance(model, OperatorRoofline)
            else Roofline(DSV3, H800, 32, 0.47, 0.75, 0.0, ExpertParallel(DSV3, H800, on))
        ).step_time_of(shape)
        assert plain.overlap_s == 0 and dbo.overlap_s > 0.5 * dbo.all_to_all_s
        assert dbo.total_s < plain.total_s
    decodes = StepShape.of([StepItem(1, 2048, True)] * 32 * 64)  # activations stay in L2 either way
    ops_plain, ops_dbo = operators(DSV3, off).step_time_of(decodes), operators(DSV3, on).step_time_of(decodes)
    assert ops_dbo.group("qkv_o").bytes == pytest.approx(2 * ops_plain.group("qkv_o").bytes)


def test_without_dp_attention_every_rank_holds_every_token_and_no_all_to_all_runs():
    """vLLM's TP + --enable-expert-parallel: attention tensor-parallel over all ep x tp GPUs, the MoE
    output combined by the TP all-reduce."""
    pool = PoolConfig(replicas=1, gpu="h800", ep=8)
    step = operators(DSV3, pool).step_time_of(StepShape.of([StepItem(1, 2048, True)] * 64))
    assert step.all_to_all_s == 0 and step.all_reduce_s > 0
    assert pool.attention_tp == 8 and pool.num_attention_ranks == 1


def test_kv_room_is_each_rank_s_memory_less_its_dense_weights_and_its_experts_slots():
    """DeepSeek-V3, EP 32 with DP attention and 32 redundant experts on H800: each GPU holds the dense
    weights whole (attention TP 1) and 9 expert slots a MoE layer; each of the 32 ranks its own KV."""
    pool = PoolConfig(replicas=1, gpu="h800", ep=32, dp_attention=True, num_redundant_experts=32)
    dense = DSV3.weight_bytes - DSV3.routed_weight_bytes
    held = dense + 58 * 9 * DSV3_EXPERT * 1
    assert weight_bytes_per_gpu(DSV3, pool) == pytest.approx(held)
    assert kv_capacity_tokens(DSV3, H800, pool, 0.9) == 32 * int((80e9 * 0.9 - held) // 70_272)


@pytest.mark.parametrize("name", ["qwen3-30b-a3b", "gpt-oss-120b"])
@pytest.mark.parametrize("time_model", ["aggregate", "operators"])
def test_a_window_of_moe_decode_steps_equals_its_steps_one_at_a_time(time_model, name):
    """(gpt-oss: decodes crossing its 128-token window within the window of steps.)"""
    model_profile = MODELS[name]
    pool = PoolConfig(replicas=1, gpu="h800", ep=8, dp_attention=True, enable_dbo=True)
    experts = ExpertParallel(model_profile, H800, pool)
    model = (
        OperatorRoofline(model_profile, H800, 1, experts=experts)
        if time_model == "operators"
        else Roofline(model_profile, H800, 8, 0.47, 0.75, 0.002, experts)
    )
    shape = StepShape.of([StepItem(1, 125 + 20 * i, True) for i in range(40)])
    window = model.step_time_of(decode_steps(shape, 5)).total_s
    for i in range(5):
        assert window[i] == model.step_time_of(decode_step(shape, i)).total_s


@pytest.mark.parametrize(
    ("pools", "message"),
    [
        (
            {"mixed": {"replicas": 1, "ep": 8}},
            "pools.mixed.ep=8: target.model='qwen2.5-7b' is dense (no experts); allowed: the default, or a "
            "mixture-of-experts target (deepseek-v3, ",
        ),
        (
            {"mixed": {"replicas": 1, "gpu": "h800", "ep": 48}, "model": "deepseek-v3"},
            "pools.mixed.ep=48: deepseek-v3's 256 routed experts + num_redundant_experts=0 do not fill 48 EP "
            "ranks evenly; allowed: an ep dividing 256 (1, 2, 4, 8, 16, 32, 64, 128, 256), or more",
        ),
        (
            {
                "mixed": {"replicas": 1, "gpu": "h800", "ep": 128, "tp": 8, "dp_attention": True},
                "model": "deepseek-v3",
            },
            "pools.mixed: ep x tp = 128 x 8 = 1024 GPUs span 128 nodes of 8; allowed: at most "
            "target.ep_fabric.max_nodes=64 nodes",
        ),
        (
            {"mixed": {"replicas": 1, "gpu": "h800", "ep": 16}, "model": "deepseek-v3"},
            "pools.mixed: tensor-parallel attention over ep x tp = 16 GPUs spans 2 nodes of 8; allowed: at "
            "most 8 GPUs, or dp_attention=true",
        ),
        (
            {"mixed": {"replicas": 1, "gpu": "h800", "ep": 8, "enable_dbo": True}, "model": "deepseek-v3"},
            "pools.mixed.enable_dbo=True: allowed only with dp_attention=True",
        ),
    ],
)
def test_a_bad_expert_parallel_layout_is_one_line(pools, message):
    model = pools.pop("model", "qwen2.5-7b")
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        build_config({"target": {"model": model}, "pools": pools})


def test_gpt_oss_sliding_layers_attend_and_read_at_most_the_window():
    """gpt-oss-120b on one H200: 18 of its 36 layers attend over the last 128 keys only. A decode at 1,000
    cached tokens attends 18 x 1,001 + 18 x 128 layer-keys (4 x 64 heads x 64 FLOPs each) and reads that
    many tokens' KV of one layer (8 KV heads x 64 x 2 x 2 B); a 512-token chunk after 1,024 cached tokens
    attends its causal keys in full layers and 512 x 128 in sliding ones. MXFP4 experts: 4.25 bits."""
    gpt_oss = MODELS["gpt-oss-120b"]
    model = operators(gpt_oss, PoolConfig(replicas=1, gpu="h200"))
    decode = model.step_time_of(StepShape.of([StepItem(1, 1000, True)]))
    layer_keys = 18 * 1001 + 18 * 128
    assert decode.group("decode_attention").flops == pytest.approx(4 * 64 * 64 * layer_keys)
    assert decode.group("decode_attention").bytes == pytest.approx(layer_keys * 8 * 64 * 2 * 2)
    routed = decode.group("routed_experts")
    assert routed.bytes == pytest.approx(4 * 3 * 2880 * 2880 * 36 * 4.25 / 8)  # its 4 experts a layer
    chunk = model.step_time_of(StepShape.of([StepItem(512, 1024, True)]))
    causal = 512 * 1024 + 512 * 513 // 2
    assert chunk.group("prefill_attention").flops == pytest.approx(
        4 * 64 * 64 * (18 * causal + 18 * 512 * 128)
    )
    assert (
        gpt_oss.kv_bytes_per_token == 36 * 2 * 8 * 64 * 2
    )  # every layer's, as vLLM without its hybrid manager


def test_a_request_runs_on_one_dp_attention_rank_so_a_lone_prompt_is_its_rank_s_whole_work():
    """Eight DP attention ranks: one 2,048-token chunk keeps its rank as busy (attention, dense layers)
    as eight chunks, one a rank; eight ranks' decodes are spread evenly."""
    pool = PoolConfig(replicas=1, gpu="h800", ep=8, dp_attention=True)
    model = operators(QWEN3, pool)
    one, eight = (model.step_time_of(StepShape.of([StepItem(2048, 0, True)] * n)) for n in (1, 8))
    for group in ("qkv_o", "prefill_attention", "logits"):
        assert one.group(group).flops == pytest.approx(eight.group(group).flops)
    decodes = model.step_time_of(StepShape.of([StepItem(1, 1000, True)] * 64))
    assert decodes.group("qkv_o").flops == pytest.approx(2 * 48 * QWEN3.attention_params * 64 / 8)


def test_dual_batch_overlap_splits_only_from_vllm_s_thresholds():
    """vLLM splits a step into two micro-batches from 32 decode tokens a rank, or 512 with prompt chunks."""
    pool = PoolConfig(replicas=1, gpu="h800", ep=8, dp_attention=True, enable_dbo=True)
    model = operators(QWEN3, pool)
    few = model.step_time_of(StepShape.of([StepItem(1, 1000, True)] * 8 * 31))
    enough = model.step_time_of(StepShape.of([StepItem(1, 1000, True)] * 8 * 32))
    assert few.overlap_s == 0 and enough.overlap_s > 0
    short_chunks = model.step_time_of(StepShape.of([StepItem(500, 0, True)] * 8))
    assert short_chunks.overlap_s == 0
