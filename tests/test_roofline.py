"""The time model pinned to DESIGN.md's reference figures (within 1 %)."""

import pytest

from emulation.profiles import GPUS, LINKS, MODELS
from emulation.roofline import Roofline
from emulation.step_shape import StepItem, StepShape
from emulation.transfer import handoff_time, layerwise_handoff_time

QWEN = MODELS["qwen2.5-7b"]
IDEAL = Roofline(QWEN, GPUS["l40s"])  # η = 1, no overhead: the roofline ideal


@pytest.mark.parametrize(
    ("name", "kv_bytes"), [("qwen2.5-7b", 57_344), ("llama-3.1-8b", 131_072), ("llama-3.1-70b", 327_680)]
)
def test_kv_bytes_per_token(name, kv_bytes):
    assert MODELS[name].kv_bytes_per_token == kv_bytes


@pytest.mark.parametrize(
    ("items", "ideal_ms"),
    [
        ([StepItem(8192, 0, True)], 332.5),  # 8,192-token prefill
        ([StepItem(2048, 3072, False)], 83.1),  # a 2,048-token chunk after 3,072 cached tokens
        ([StepItem(1, 8192, True)], 16.9),  # one decode at 8k context
        ([StepItem(1, 8192, True)] * 2, 17.5),
        ([StepItem(1, 1024, True)] * 64, 20.7),
    ],
)
@pytest.mark.parametrize("time_model", ["aggregate", "operators"])
def test_roofline_ideals(items, ideal_ms, time_model):
    """Both time models at peak efficiency without overhead give DESIGN.md's ideal figures."""
    from emulation.config import CpuOverhead, OperatorEfficiencies
    from emulation.operators import OperatorRoofline

    peak = OperatorEfficiencies(1.0, 1.0, 1.0, 1.0, 1.0)
    ideal = (
        IDEAL
        if time_model == "aggregate"
        else OperatorRoofline(QWEN, GPUS["l40s"], 1, peak, CpuOverhead(0, 0, 0))
    )
    assert ideal.step_time(items).total_s * 1000 == pytest.approx(ideal_ms, rel=0.01)


def test_step_time_is_itemised_and_fitted():
    fitted = Roofline(QWEN, GPUS["l40s"], eta_compute=0.47, eta_bandwidth=0.75, overhead_s=0.002)
    prefill = fitted.step_time([StepItem(8192, 0, True)])
    assert prefill.bound == "compute"
    assert prefill.total_s == pytest.approx(prefill.compute_s + 0.002)
    decode = fitted.step_time([StepItem(1, 8192, True)])
    assert decode.bound == "memory"
    assert decode.total_s == pytest.approx(0.0169 / 0.75 + 0.002, rel=0.01)


def test_a_step_shape_sums_its_items():
    items = [StepItem(1, 5000, True), StepItem(700, 300, False), StepItem(40, 0, True)]
    shape = StepShape.of(items)
    keys = sum(
        i.num_new_tokens * i.num_context_tokens + i.num_new_tokens * (i.num_new_tokens + 1) // 2
        for i in items
    )
    assert (shape.num_new_tokens, shape.num_logits, shape.num_requests) == (741, 2, 3)
    assert (shape.keys_attended, shape.num_context_tokens) == (keys, 5300)
    assert (shape.num_decodes, shape.decode_keys_attended) == (1, 5001)
    assert shape.prefill_kv_tokens == 300 + 700 + 40 and shape.num_prefill_tokens == 740
    assert IDEAL.step_time(items) == IDEAL.step_time_of(shape)


def test_tensor_parallel_scales_peaks():
    tp2 = Roofline(MODELS["llama-3.1-70b"], GPUS["h100-sxm"], tp=2)
    tp1 = Roofline(MODELS["llama-3.1-70b"], GPUS["h100-sxm"], tp=1)
    item = [StepItem(4096, 0, True)]
    assert tp2.step_time(item).compute_s == pytest.approx(tp1.step_time(item).compute_s / 2)


def test_kv_capacity():
    from emulation.config import PoolConfig
    from emulation.kv_cache import kv_capacity_tokens as capacity

    def kv_capacity_tokens(model, gpu, tp, utilization):
        return capacity(model, gpu, PoolConfig(replicas=1, tp=tp), utilization)

    # 48 GB × 0.9 − 15.23 GB of weights over 56 KiB per token
    tokens = kv_capacity_tokens(QWEN, GPUS["l40s"], 1, 0.9)
    assert tokens == pytest.approx((48e9 * 0.9 - QWEN.weight_bytes) / 57_344, rel=1e-6)
    assert kv_capacity_tokens(MODELS["llama-3.1-70b"], GPUS["l40s"], 1, 0.9) == 0
    # Llama-3.1-70B on H100s: per GPU 72 GB minus an eighth (a quarter) of 141 GB, over 40 (80) KiB
    llama, h100 = MODELS["llama-3.1-70b"], GPUS["h100-sxm"]
    for tp in (4, 8):
        want = (80e9 * 0.9 - llama.weight_bytes / tp) / (327_680 / tp)
        assert kv_capacity_tokens(llama, h100, tp, 0.9) == pytest.approx(want, rel=1e-5)
    # Qwen2.5-7B has 4 KV heads: at TP 8 each GPU still holds one (a quarter of the KV)
    assert kv_capacity_tokens(QWEN, h100, 8, 0.9) == pytest.approx(
        (80e9 * 0.9 - QWEN.weight_bytes / 8) / (57_344 / 4), rel=1e-6
    )


def test_guide_testbox_handoff():
    kv = 8192 * QWEN.kv_bytes_per_token  # 470 MB
    assert kv == pytest.approx(470e6, rel=0.01)
    t = handoff_time(kv, 512, LINKS["guide-testbox"])
    assert t.total_s == pytest.approx(1.3, rel=0.01)
    assert t.overhead_s > 10 * t.wire_s  # overhead, not bandwidth


def test_fast_links():
    kv = 8192 * QWEN.kv_bytes_per_token
    assert handoff_time(kv, 512, LINKS["rdma-400g"]).total_s == pytest.approx(0.020, rel=0.05)
    assert handoff_time(kv, 512, LINKS["nvlink"]).total_s < 0.005


def test_layerwise_hides_transfer_under_compute():
    link = LINKS["pcie4-x16"]
    full = handoff_time(470_000_000, 512, link)
    hidden = layerwise_handoff_time(470_000_000, 512, link, compute_s=1.0, num_layers=28)
    assert hidden.total_s == pytest.approx(full.total_s / 28)
    exposed = layerwise_handoff_time(470_000_000, 512, link, compute_s=0.005, num_layers=28)
    assert exposed.total_s == pytest.approx(full.total_s - 0.005 + full.total_s / 28)
    none = layerwise_handoff_time(470_000_000, 512, link, compute_s=0.0, num_layers=1)
    assert none.total_s == pytest.approx(full.total_s)


def test_the_vision_encoder_matches_the_reference_figures():
    """Qwen2.5-VL's ViT, derived from its vision_config (nothing fitted): ~676M parameters, 448^2
    (1,024 patches) ~1.35 TFLOP, ~1.4 ms on an H100 and ~3.7 ms on an L40S at peak; 7 KiB per visual
    token for a 3,584-wide language model."""
    from emulation.profiles import GPUS, MODELS
    from emulation.vision import EncoderRoofline
    from emulation.vision_encoders import VISION_ENCODERS

    vit = VISION_ENCODERS[MODELS["qwen2.5-vl-7b"].vision_encoder]
    assert vit.weight_bytes / 2 == pytest.approx(676e6, rel=0.01)
    assert vit.flops(1024) == pytest.approx(1.35e12, rel=0.01)
    assert vit.embedding_bytes_per_token == 7 * 1024
    h100, l40s = (EncoderRoofline(vit, GPUS[g]).encode_time([1024]) for g in ("h100-sxm", "l40s"))
    assert h100.total_s == pytest.approx(1.4e-3, rel=0.05) and l40s.total_s == pytest.approx(3.7e-3, rel=0.05)
    assert h100.bound == "compute"
    # two images cost their sum; attention grows with the square of a single image's patches
    r = EncoderRoofline(vit, GPUS["h100-sxm"])
    assert r.encode_time([1024, 1024]).flops == pytest.approx(2 * vit.flops(1024))
    assert vit.flops(4096) > 4 * vit.flops(1024)


def test_qwen2_5_vl_3b_is_the_same_vit_ending_at_its_smaller_lm():
    from emulation.profiles import MODELS
    from emulation.vision_encoders import VISION_ENCODERS

    lm = MODELS["qwen2.5-vl-3b"]
    vit = VISION_ENCODERS[lm.vision_encoder]
    assert lm.num_params == pytest.approx(3.09e9, rel=0.01)  # Qwen2.5-3B: 3.09B, tied embeddings
    assert vit.out_hidden_size == lm.hidden_size == 2048 and vit.embedding_bytes_per_token == 4096
    assert vit.flops(1024) == pytest.approx(VISION_ENCODERS["qwen2.5-vl-vit-7b"].flops(1024), rel=0.02)


def test_qwen3_vl_4b_is_its_config_with_deepstack_embeddings():
    """Qwen3-VL-4B-Instruct from its config: a 4.0B language model (tied embeddings), a 24-block ViT of
    16-pixel patches with a plain MLP and three DeepStack mergers; each visual token crosses the
    encoder/prefill cut as four 2,560-wide embeddings (20 KiB)."""
    from emulation.profiles import MODELS
    from emulation.vision import vision_encoder_of

    lm = MODELS["qwen3-vl-4b"]
    vit = vision_encoder_of("qwen3-vl-4b")
    assert vit is not None and lm.num_params == pytest.approx(4.02e9, rel=0.01)
    assert vit.out_hidden_size == lm.hidden_size and vit.embedding_bytes_per_token == 20 * 1024
    # 448^2 = 784 patches: 304M parameters per patch, 109M (four mergers) per token of 32 x 32 pixels,
    # full attention in all 24 blocks: ~0.58 TFLOP
    expected = 2 * 0.304e9 * 784 + 2 * 0.109e9 * 196 + 4 * 1024 * 784 * 24 * 784
    assert vit.flops(784) == pytest.approx(expected, rel=0.01) == pytest.approx(0.58e12, rel=0.01)


@pytest.mark.parametrize("name", ["qwen2.5-vl-vit-7b", "qwen3-vl-vit-4b"])
def test_vision_encoder_parameters_match_transformers_models_of_the_same_config(name):
    """Each ViT profile's parameters against transformers' own vision model built (on the meta device:
    no weights) from the same config, per part; biases and norms are the small difference."""
    import torch

    from emulation.vision_encoders import VISION_ENCODERS

    vit = VISION_ENCODERS[name]
    if name.startswith("qwen3"):
        from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel as Model

        config = Qwen3VLVisionConfig(
            depth=vit.depth, hidden_size=vit.hidden_size, intermediate_size=vit.intermediate_size,
            num_heads=vit.num_heads, out_hidden_size=vit.out_hidden_size, patch_size=vit.patch_size,
            deepstack_visual_indexes=[5, 11, 17],
        )  # fmt: skip
        mergers = ("merger", "deepstack_merger_list")
    else:
        from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
            Qwen2_5_VisionTransformerPretrainedModel as Model,
        )

        config = Qwen2_5_VLVisionConfig(
            depth=vit.depth, hidden_size=vit.hidden_size, intermediate_size=vit.intermediate_size,
            num_heads=vit.num_heads, out_hidden_size=vit.out_hidden_size,
            fullatt_block_indexes=[7, 15, 23, 31],
        )  # fmt: skip
        mergers = ("merger",)
    with torch.device("meta"):
        model = Model._from_config(config)
    parts: dict[str, int] = {}
    for n, p in model.named_parameters():
        parts[n.split(".")[0]] = parts.get(n.split(".")[0], 0) + p.numel()
    assert vit.num_block_params == pytest.approx(parts["blocks"], rel=0.01)
    assert vit.num_merger_params == pytest.approx(sum(parts[m] for m in mergers), rel=0.01)
    assert vit.num_patch_embed_params == pytest.approx(parts["patch_embed"], rel=0.01)


@pytest.mark.parametrize("tp", [1, 4])
def test_a_steps_work_per_gpu_is_the_time_models_figures(tp):
    """vLLM's MFU figures, from the same arithmetic that times the step: FLOPs and bytes read (weights,
    the cached KV) split over the `tp` GPUs, and the KV the new tokens write (not priced)."""
    m = MODELS["qwen2.5-7b"]
    step = Roofline(m, GPUS["h100-sxm"], tp).step_time([StepItem(2048, 3072, True), StepItem(1, 8191, True)])
    assert step.flops_per_gpu == step.flops / tp and step.read_bytes_per_gpu == step.bytes / tp
    assert step.read_bytes_per_gpu == (m.step_weight_bytes + (3072 + 8191) * m.kv_bytes_per_token) / tp
    assert step.write_bytes_per_gpu == 2049 * m.kv_bytes_per_token / tp
    idle = Roofline(m, GPUS["h100-sxm"], tp).step_time([])
    assert (idle.flops_per_gpu, idle.read_bytes_per_gpu, idle.write_bytes_per_gpu) == (0, 0, 0)
