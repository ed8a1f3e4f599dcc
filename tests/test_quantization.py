"""Weight and KV cache formats, checked by hand: what a format stores, the tensor cores its GEMMs run
on (weight-only where a GPU has none of them, as vLLM runs it), what an FP8 KV cache halves, and the
one combination vLLM refuses."""

from __future__ import annotations

import pytest

from cluster.config_load import ConfigError, load_designs
from emulation.config import TestbedConfig
from emulation.kv_cache import block_bytes, num_gpu_blocks
from emulation.profiles import GPUS
from emulation.quantization import FORMATS, gemm_compute
from emulation.step_shape import StepItem
from emulation.time_model import time_model_for

LLAMA_70B = "meta-llama/Meta-Llama-3.1-70B"


def _llama(*sets: str, time_model: str = "operators", gpu: str = "h100_sxm", tp: int = 4) -> TestbedConfig:
    base = [f"target.model={LLAMA_70B}", f"pools.mixed.gpu={gpu}", f"pools.mixed.tp={tp}"]
    (cfg,) = load_designs("guide-l40s", ["collocated"], [*base, f"target.time_model={time_model}", *sets])
    return cfg


def test_fp8_weights_halve_the_layer_weights_bytes_and_leave_embeddings_and_head():
    bf16, fp8 = _llama().target.profile, _llama("target.quantization.weights=fp8").target.profile
    head_and_embeddings = 2 * bf16.num_head_params * 2  # untied: two vocab x hidden matrices in BF16
    assert fp8.weight_bytes - head_and_embeddings == (bf16.weight_bytes - head_and_embeddings) / 2
    assert bf16.weight_bytes == pytest.approx(141.1e9, rel=0.001)  # 70.55B parameters in BF16


@pytest.mark.parametrize("time_model", ["operators", "aggregate"])
def test_fp8_weights_make_a_small_batch_decode_step_of_llama_70b_at_tp4_on_h100_1_6_to_2x_faster(time_model):
    """Eight decodes at 2k context: the step streams 35 GB of weights over 4 GPUs and little KV, so
    halving the weights takes it most of the way to 2x (the KV reads and the CPU's time stay)."""
    decodes = [StepItem(1, 2048, True)] * 8
    times = [
        time_model_for(cfg, cfg.pools.mixed).step_time(decodes).total_s
        for cfg in (
            _llama(time_model=time_model),
            _llama("target.quantization.weights=fp8", time_model=time_model),
        )
    ]
    assert 1.6 <= times[0] / times[1] <= 2.0


def test_an_8k_prefills_gemms_run_at_the_fp8_peak():
    prompt = [StepItem(8192, 0, True)]
    steps = [
        time_model_for(c, c.pools.mixed).step_time(prompt)
        for c in (_llama(), _llama("target.quantization.weights=fp8"))
    ]
    h100 = GPUS["h100_sxm"]
    for name in ("qkv_o", "mlp"):
        bf16, fp8 = steps[0].group(name), steps[1].group(name)
        assert bf16.flops == fp8.flops
        assert bf16.compute_s / fp8.compute_s == pytest.approx(h100.peak_fp8_tflops / h100.peak_tflops)
    assert steps[0].group("prefill_attention") == steps[1].group("prefill_attention")  # BF16 attention


def test_on_a100_fp8_weights_run_weight_only_at_the_bf16_peak_with_their_bytes_halved():
    """vLLM runs FP8 on Ampere with Marlin's weight-only kernels: one byte a weight, BF16 GEMMs."""
    prompt = [StepItem(8192, 0, True)]
    cfgs = [_llama(*sets, gpu="a100_sxm") for sets in ((), ("target.quantization.weights=fp8",))]
    bf16, fp8 = (time_model_for(c, c.pools.mixed).step_time(prompt).group("mlp") for c in cfgs)
    assert fp8.compute_s == bf16.compute_s
    assert fp8.memory_s < bf16.memory_s
    assert gemm_compute("fp8", GPUS["a100_sxm"], "linear") == "bf16"


@pytest.mark.parametrize(
    ("fmt", "gpu", "linear", "moe"),
    [
        ("fp8", "l40s", "fp8", "fp8"),
        ("fp8_block", "l40s", "bf16", "fp8"),  # sm 89: Marlin for linear layers, Triton W8A8 for MoE
        ("fp8_block", "h200_sxm", "fp8", "fp8"),
        ("nvfp4", "h200_sxm", "bf16", "bf16"),  # Marlin FP4 before Blackwell
        ("nvfp4", "b200_sxm", "fp4", "fp4"),
        ("nvfp4", "rtx_pro_6000_server", "fp4", "fp4"),
        ("mxfp4", "b200_sxm", "bf16", "bf16"),  # vLLM's default MXFP4 MoE takes BF16 activations
        ("int4_wo", "b200_sxm", "bf16", "bf16"),
        ("fp8", "ascend-910c", "fp8", "fp8"),  # its INT8 peak, as W8A8 INT8
    ],
)
def test_each_format_runs_on_the_tensor_cores_vllms_kernels_use_on_the_gpu(fmt, gpu, linear, moe):
    assert (gemm_compute(fmt, GPUS[gpu], "linear"), gemm_compute(fmt, GPUS[gpu], "moe")) == (linear, moe)


def test_stored_bytes_count_the_scales_of_block_formats():
    assert FORMATS["nvfp4"].bytes_per_weight == 9 / 16  # 4 bits and an FP8 scale per 16
    assert FORMATS["mxfp4"].bytes_per_weight == 4.25 / 8  # 4 bits and an 8-bit scale per 32
    assert FORMATS["int4_wo"].bytes_per_weight == 9 / 16  # 4 bits and a BF16 scale per 32


def test_an_fp8_kv_cache_halves_a_tokens_kv_the_handoffs_bytes_and_doubles_the_blocks_room():
    bf16, fp8 = _llama(), _llama("target.quantization.kv_cache=fp8")
    pb, pf = bf16.target.profile, fp8.target.profile
    assert (
        pb.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 and pf.kv_bytes_per_token == pb.kv_bytes_per_token / 2
    )
    pool = bf16.pools.mixed
    assert block_bytes(pf, pool, 16) == block_bytes(pb, pool, 16) / 2  # what a handoff or offload moves
    assert num_gpu_blocks(fp8, pool) == pytest.approx(2 * num_gpu_blocks(bf16, pool), abs=2)


def test_a_pd_handoff_ships_half_the_bytes_with_an_fp8_kv_cache():
    from cluster.virtual import run_virtual
    from workloads.summary import handoffs

    sets = [
        "runner.compute=skip",
        "workload.num_requests=4",
        "workload.prompt_len=2048",
        "workload.output_len=4",
    ]
    shipped = []
    for kv in ("bf16", "fp8"):
        (cfg,) = load_designs("guide-l40s", ["pd-fast"], [*sets, f"target.quantization.kv_cache={kv}"])
        shipped.append(handoffs(run_virtual(cfg).results)["kv_bytes"].sum())
    assert shipped[0] > 0 and shipped[1] == shipped[0] / 2


def test_a_checkpoints_own_kv_format_is_the_default_and_can_be_overridden():
    sets = ["target.model=nvidia/Llama-3.1-70B-Instruct-FP8", "pools.mixed.gpu=h100_sxm", "pools.mixed.tp=4"]
    (cfg,) = load_designs("guide-l40s", ["collocated"], sets)
    assert (cfg.target.profile.weight_format, cfg.target.profile.kv_dtype_bytes) == ("fp8", 1)
    (cfg,) = load_designs("guide-l40s", ["collocated"], [*sets, "target.quantization.kv_cache=bf16"])
    assert cfg.target.profile.kv_dtype_bytes == 2


def test_experts_follow_the_weights_when_only_the_weights_are_set():
    (cfg,) = load_designs("qwen3-30b-a3b-h100", ["tp8-ep8"], ["target.quantization.weights=nvfp4"])
    assert (cfg.target.profile.weight_format, cfg.target.profile.expert_format) == ("nvfp4", "nvfp4")
    (cfg,) = load_designs("qwen3-30b-a3b-h100", ["tp8-ep8"], ["target.quantization.experts=mxfp4"])
    assert (cfg.target.profile.weight_format, cfg.target.profile.expert_format) == ("bf16", "mxfp4")


def test_an_fp8_kv_cache_of_an_mla_model_on_an_a100_is_refused_as_vllm_refuses_it():
    sets = ["target.model=deepseek-ai/DeepSeek-R1", "pools.mixed.gpu=a100_sxm", "pools.mixed.tp=8"]
    with pytest.raises(ConfigError) as e:
        load_designs("guide-l40s", ["collocated"], [*sets, "target.quantization.kv_cache=fp8"])
    assert str(e.value).startswith("target.quantization.kv_cache='fp8': vLLM has no MLA attention backend")
    assert "allowed: bf16" in str(e.value)


def test_a_format_that_is_not_one_is_one_line_listing_them():
    with pytest.raises(ConfigError, match=r"target.quantization.weights='fp4'.*'nvfp4'"):
        load_designs("guide-l40s", ["collocated"], ["target.quantization.weights=fp4"])
