"""Hybrid models' per-layer state and KV, by hand from their public configs and vLLM's formulas
(emulation/ssm.py), checked against transformers' own mixers built from the same values."""

from __future__ import annotations

import pytest
import torch

from emulation.hybrid_models import LAYER_TYPES, NEMOTRON_3_NANO_PATTERN
from emulation.profiles import MODELS
from emulation.ssm import Mamba2Geometry, hybrid_page

NANO = MODELS["nemotron-3-nano-30b-a3b"]
QWEN3_NEXT = MODELS["qwen3-next-80b-a3b"]
GRANITE = MODELS["granite-4.0-h-tiny"]


def test_nemotron_3_nano_at_tp2_ships_its_state_beyond_2084_prompt_tokens():
    """At TP 2 a Mamba layer's state is SSM (64/2 heads, 64, 128) in fp32 + conv (3, (64·64 + 2·8·128)/2)
    in bf16 = 1,048,576 + 18,432 = 1,067,008 B (1.02 MiB); an attention layer's KV 2 x 1 head x 128 x 2 B
    = 512 B a token; so one layer's state is the smaller to ship beyond 1,067,008 / 512 = 2,084 tokens,
    the model's 23 states against its 6 attention layers beyond 7,988.7.

    The issue names 1.52 MiB, (48, 64, 128), 2 KiB and 777 tokens. Those are not Nemotron-3-Nano's: its
    config has 64 Mamba heads (32 a rank at TP 2, not 48) and 2 KV heads (512 B a token a rank, not 2 KiB).
    They come from an example in vLLM's hybrid P/D blog post, and match Granite-4.0-H-Tiny at TP 1 with a
    float32 state (the last test). The testbed follows the config, not the example."""
    state = NANO.ssm.state(2)
    assert state.ssm == (32, 64, 128) and state.conv == (3, 3072)
    assert (state.ssm_bytes, state.conv_bytes) == (1_048_576, 18_432)
    assert NANO.state_bytes_per_layer(2) == 1_067_008
    assert NANO.state_bytes_per_layer(2) / 2**20 == pytest.approx(1.0176, abs=1e-4)
    assert NANO.kv_bytes_per_token_per_layer(2) == 512
    assert NANO.state_bytes_per_layer(2) / NANO.kv_bytes_per_token_per_layer(2) == 2084
    assert (NANO.num_ssm_layers, NANO.num_attention_layers) == (23, 6)
    assert NANO.state_crossover_tokens(2) == pytest.approx(7988.7, abs=0.05) == NANO.state_crossover_tokens(1)


def test_vllms_page_size_raises_the_attention_block_until_it_holds_a_state():
    """Nano at TP 2: 16 · cdiv(1,067,008, 16 x 512) = 2,096 tokens a block; a state page is padded by
    2,096 x 512 - 1,067,008 = 6,144 B (0.58 %). Qwen3-Next at TP 1: 16 · cdiv(1,097,728, 16 x 2,048) = 544.
    The configured block size is the least (vLLM never lowers it)."""
    page = NANO.page(2)
    assert (page.block_size, page.page_bytes, page.padding_bytes) == (2096, 2096 * 512, 6144)
    assert QWEN3_NEXT.page(1).block_size == 544
    assert MODELS["qwen2.5-7b"].page(2, 32).block_size == 32  # no state: the block size stays
    assert hybrid_page(1000, 100, block_size=64).block_size == 64  # a state of 10 tokens' KV: no raise
    assert hybrid_page(100_000, 100, block_size=64).block_size == 64 * 16  # align 64: 1,024


def test_qwen3_next_gated_delta_net_state():
    """conv (3, 2 x 128 x 16 + 128 x 32 = 8,192) + recurrent (32, 128, 128), both bf16 = 1,097,728 B; KV
    2 x 2 x 256 x 2 B = 2,048 B a token: 536 tokens a layer, 36 states against 12 attention layers 1,608."""
    qwen = QWEN3_NEXT
    assert qwen.ssm is not None
    state = qwen.ssm.state(1)
    assert state.conv == (3, 8192) and state.ssm == (32, 128, 128) and state.nbytes == 1_097_728
    assert qwen.kv_bytes_per_token_per_layer(1) == 2048
    assert qwen.state_crossover_tokens(1) == pytest.approx(1608.0, abs=0.1)
    assert qwen.ssm.state(2).ssm == (16, 128, 128) and qwen.ssm.state(2).conv == (3, 4096)


def test_granite_4_h_tiny_and_the_figure_the_issue_names():
    """Granite-4.0-H-Tiny at TP 1: SSM (48, 64, 128), conv (3, 48·64 + 2·1·128 = 3,328); with vLLM's bf16
    state 806,400 B against 2 x 4 x 128 x 2 = 2,048 B a token: 393.75 tokens. With a float32 state it is
    1,592,832 B (1.52 MiB) and 777.8 tokens: the issue's figure. One group over 2 ranks: replicated
    (vLLM's extra_groups_for_head_shards), conv (3, (3,072 + 2·2·128) / 2 = 1,792)."""
    granite = GRANITE
    assert granite.ssm is not None
    assert granite.ssm.state(1).ssm == (48, 64, 128) and granite.ssm.state(1).conv == (3, 3328)
    assert granite.state_bytes_per_layer(1) == 806_400 and granite.kv_bytes_per_token_per_layer(1) == 2048
    fp32 = Mamba2Geometry(
        num_heads=48,
        head_dim=64,
        n_groups=1,
        state_size=128,
        conv_kernel=4,
        chunk_size=256,
        ssm_dtype_bytes=4,
    )
    assert fp32.state(1).nbytes == 1_592_832 and fp32.state(1).nbytes / 2048 == pytest.approx(777.75)
    assert granite.ssm.state(2).conv == (3, 1792)
    assert (granite.num_ssm_layers, granite.num_attention_layers) == (36, 4)


def test_the_geometry_is_transformers_own():
    """transformers' mixers built from the same config values (on the meta device) have the same channel
    counts and head shapes, and its config the same layer order."""
    from transformers import GraniteMoeHybridConfig, NemotronHConfig, Qwen3NextConfig
    from transformers.models.granitemoehybrid import modeling_granitemoehybrid
    from transformers.models.nemotron_h import modeling_nemotron_h
    from transformers.models.qwen3_next import modeling_qwen3_next

    nano = NemotronHConfig(
        hidden_size=2688, num_hidden_layers=52, hybrid_override_pattern=NEMOTRON_3_NANO_PATTERN,
        mamba_num_heads=64, mamba_head_dim=64, n_groups=8, ssm_state_size=128, conv_kernel=4,
        num_attention_heads=32, num_key_value_heads=2, head_dim=128,
    )  # fmt: skip
    kinds = {"linear_attention": "ssm", "full_attention": "attention", "moe": "moe", "mlp": "mlp"}
    assert tuple(kinds[k] for k in nano.layers_block_type) == LAYER_TYPES[NANO.name]
    qwen = Qwen3NextConfig()  # its defaults: Qwen/Qwen3-Next-80B-A3B-Instruct's
    assert tuple(kinds[k] for k in qwen.layer_types) == LAYER_TYPES[QWEN3_NEXT.name]
    assert (
        tuple("attention" if k == "attention" else "ssm" for k in granite_layers())
        == LAYER_TYPES[GRANITE.name]
    )
    granite = GraniteMoeHybridConfig(
        hidden_size=1536, num_hidden_layers=40, mamba_n_heads=48, mamba_d_head=64, mamba_n_groups=1,
        mamba_d_state=128, mamba_d_conv=4, num_attention_heads=12, num_key_value_heads=4,
        layer_types=granite_layers(),
    )  # fmt: skip
    with torch.device("meta"):
        mixers = {
            "nemotron-3-nano-30b-a3b": modeling_nemotron_h.NemotronHMamba2Mixer(nano, layer_idx=0),
            "qwen3-next-80b-a3b": modeling_qwen3_next.Qwen3NextGatedDeltaNet(qwen, layer_idx=0),
            "granite-4.0-h-tiny": modeling_granitemoehybrid.GraniteMoeHybridMambaLayer(granite, layer_idx=0),
        }
    for name, mixer in mixers.items():
        ssm = MODELS[name].ssm
        assert ssm is not None
        state = ssm.state(1)
        assert (state.conv[0] + 1, state.conv[1]) == (mixer.conv_kernel_size, mixer.conv_dim), name
    assert mixers["qwen3-next-80b-a3b"].num_v_heads == 32
    assert mixers["nemotron-3-nano-30b-a3b"].num_heads == NANO.ssm.state(1).ssm[0] == 64


def granite_layers() -> list[str]:
    return ["attention" if i in (5, 15, 25, 35) else "mamba" for i in range(40)]


NANO_CONFIG = {
    "vocab_size": 131072,
    "hidden_size": 2688,
    "num_hidden_layers": 52,
    "tie_word_embeddings": False,
    "hybrid_override_pattern": NEMOTRON_3_NANO_PATTERN,
    "mamba_num_heads": 64,
    "mamba_head_dim": 64,
    "n_groups": 8,
    "ssm_state_size": 128,
    "conv_kernel": 4,
    "chunk_size": 128,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "n_routed_experts": 128,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 1856,
    "moe_shared_expert_intermediate_size": 3712,
    "intermediate_size": 1856,
    "n_group": 1,
    "topk_group": 1,
}
GRANITE_CONFIG = {
    "vocab_size": 100352, "hidden_size": 1536, "num_hidden_layers": 40, "tie_word_embeddings": True,
    "num_attention_heads": 12, "num_key_value_heads": 4, "intermediate_size": 512,
    "shared_intermediate_size": 1024, "num_local_experts": 64, "num_experts_per_tok": 6, "mamba_n_heads": 48,
    "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_conv": 4,
}  # fmt: skip
PUBLISHED = {"nemotron-3-nano-30b-a3b": 31.6e9, "qwen3-next-80b-a3b": 80e9, "granite-4.0-h-tiny": 7e9}
"""Total parameters their model cards name."""


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameters_match_transformers_model_of_the_same_config(name):
    """The profile's parameters against transformers' own class built from the same config values on
    the meta device; what the profile leaves out (norms, conv filters, A, D, dt biases, the shared
    expert's gate) is under 0.1 %."""
    from transformers import (
        GraniteMoeHybridConfig,
        GraniteMoeHybridForCausalLM,
        NemotronHConfig,
        NemotronHForCausalLM,
        Qwen3NextConfig,
        Qwen3NextForCausalLM,
    )

    build = {
        "nemotron-3-nano-30b-a3b": (NemotronHForCausalLM, NemotronHConfig(**NANO_CONFIG)),
        "qwen3-next-80b-a3b": (Qwen3NextForCausalLM, Qwen3NextConfig()),
        "granite-4.0-h-tiny": (
            GraniteMoeHybridForCausalLM,
            GraniteMoeHybridConfig(**GRANITE_CONFIG, layer_types=granite_layers()),
        ),
    }
    cls, config = build[name]
    with torch.device("meta"):
        model = cls._from_config(config)
    counted = sum(p.numel() for p in model.parameters())
    profile = MODELS[name]
    assert profile.num_params == pytest.approx(counted, rel=1e-3)
    assert profile.num_params == pytest.approx(PUBLISHED[name], rel=0.01)
