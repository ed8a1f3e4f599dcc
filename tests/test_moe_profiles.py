"""Each mixture-of-experts profile against transformers' own model class built from the same public
config values on the meta device (no weights): total parameters, and the active ones per token
against the published figures."""

from __future__ import annotations

import pytest

from emulation.profiles import MODELS

QWEN3_MOE = {"tie_word_embeddings": False, "decoder_sparse_step": 1, "mlp_only_layers": []}
CONFIGS = {
    "deepseek-v3": ("DeepseekV3", {
        "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
        "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "tie_word_embeddings": False,
    }),
    "qwen3-235b-a22b": ("Qwen3Moe", {
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288, "moe_intermediate_size": 1536,
        "num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 128,
        "num_experts": 128, "num_experts_per_tok": 8, **QWEN3_MOE,
    }),
    "qwen3-30b-a3b": ("Qwen3Moe", {
        "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "num_experts": 128, "num_experts_per_tok": 8, **QWEN3_MOE,
    }),
    "mixtral-8x7b": ("Mixtral", {
        "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    }),
    "gpt-oss-120b": ("GptOss", {
        "vocab_size": 201088, "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 128,
        "num_experts_per_tok": 4, "sliding_window": 128, "tie_word_embeddings": False,
    }),
    "mixtral-8x22b": ("Mixtral", {
        "vocab_size": 32000, "hidden_size": 6144, "intermediate_size": 16384, "num_hidden_layers": 56,
        "num_attention_heads": 48, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    }),
    "dbrx": ("Dbrx", {
        "vocab_size": 100352, "d_model": 6144, "n_layers": 40, "n_heads": 48, "max_seq_len": 32768,
        "attn_config": {"kv_n_heads": 8, "clip_qkv": 8, "rope_theta": 500000},
        "ffn_config": {"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4},
        "tie_word_embeddings": False,
    }),
}  # fmt: skip
# Published totals and active parameters (model cards; DeepSeek-V3 without its MTP module), and whether
# the active count includes the embedding (gpt-oss's counts the unembedding only).
PUBLISHED = {
    "deepseek-v3": (671e9, 37e9, True),
    "qwen3-235b-a22b": (235e9, 22e9, True),
    "qwen3-30b-a3b": (30.5e9, 3.3e9, True),
    "mixtral-8x7b": (46.7e9, 12.9e9, True),
    "gpt-oss-120b": (116.83e9, 5.13e9, False),
    "mixtral-8x22b": (141e9, 39e9, True),
    "dbrx": (132e9, 36e9, True),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parameters_match_transformers_model_of_the_same_config(name):
    import torch
    import transformers

    arch, values = CONFIGS[name]
    config = getattr(transformers, f"{arch}Config")(**values)
    with torch.device("meta"):
        model = getattr(transformers, f"{arch}ForCausalLM")._from_config(config)
    counted = sum(p.numel() for p in model.parameters())
    profile = MODELS[name]
    # norms, biases and attention sinks are the difference (gpt-oss has biases on every projection)
    assert profile.num_params == pytest.approx(counted, rel=1e-3 if name == "gpt-oss-120b" else 1e-5)
    total, active, with_embedding = PUBLISHED[name]
    assert profile.num_params == pytest.approx(total, rel=0.01)
    per_token = profile.num_active_layer_params + (1 + with_embedding) * profile.num_head_params
    assert per_token == pytest.approx(active, rel=0.04)
