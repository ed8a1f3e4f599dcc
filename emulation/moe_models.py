"""Mixture-of-experts target models, from their public Hugging Face `config.json` files (the values
below are those files' fields; tests/test_moe_profiles.py builds transformers' own class of each from
the same values on the meta device and checks the parameter counts)."""

from __future__ import annotations

from emulation.mla import MlaGeometry
from emulation.model_profile import ModelProfile
from emulation.moe import MoeGeometry

MOE_MODELS: tuple[ModelProfile, ...] = (
    # deepseek-ai/DeepSeek-V3 config.json (DeepSeek-R1 shares it): 61 layers, the first 3 dense
    # (first_k_dense_replace), 1 shared + 256 routed experts of 2,048, top-8; MLA with q_lora_rank 1,536,
    # kv_lora_rank 512, rope 64, nope 128, v 128; FP8 (e4m3, 128 x 128 blocks) layer weights. 671B
    # parameters without the multi-token-prediction module (arXiv 2412.19437, section 4.2).
    ModelProfile(
        "deepseek-v3",
        num_layers=61,
        num_heads=128,
        num_kv_heads=128,
        head_dim=128,
        hidden_size=7168,
        intermediate_size=18432,
        vocab_size=129280,
        moe=MoeGeometry(
            num_experts=256,
            num_experts_per_tok=8,
            moe_intermediate_size=2048,
            shared_expert_intermediate_size=2048,
            num_dense_layers=3,
        ),
        mla=MlaGeometry(
            kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536
        ),
        weight_format="fp8_block",
        expert_format="fp8_block",
    ),
    # Qwen/Qwen3-235B-A22B config.json: 94 layers, all sparse (decoder_sparse_step 1, no mlp_only_layers),
    # 128 experts of 1,536, top-8, no shared expert; GQA 64 q heads, 4 KV heads of 128.
    ModelProfile(
        "qwen3-235b-a22b",
        num_layers=94,
        num_heads=64,
        num_kv_heads=4,
        head_dim=128,
        hidden_size=4096,
        intermediate_size=12288,
        vocab_size=151936,
        moe=MoeGeometry(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1536),
    ),
    # Qwen/Qwen3-30B-A3B config.json: 48 layers, 128 experts of 768, top-8; GQA 32 q heads, 4 KV of 128.
    ModelProfile(
        "qwen3-30b-a3b",
        num_layers=48,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        hidden_size=2048,
        intermediate_size=6144,
        vocab_size=151936,
        moe=MoeGeometry(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768),
    ),
    # mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, 8 experts (num_local_experts) of 14,336, top-2,
    # GQA 32 q heads, 8 KV of 128; sliding_window null (full attention).
    ModelProfile(
        "mixtral-8x7b",
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        hidden_size=4096,
        intermediate_size=14336,
        vocab_size=32000,
        moe=MoeGeometry(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=14336),
    ),
    # openai/gpt-oss-120b config.json (transformers' GptOssConfig defaults are its values): 36 layers
    # alternating sliding-window (128 keys, from the first layer) and full attention, each head with a
    # learned attention sink; 128 experts of 2,880, top-4, no shared expert; GQA 64 q heads, 8 KV of 64;
    # the experts' weights MXFP4 (4-bit values, an 8-bit scale per 32: 4.25 bits), the rest BF16. 116.8B
    # parameters, 5.1B active (model card, arXiv 2508.10925, table 1).
    ModelProfile(
        "gpt-oss-120b",
        num_layers=36,
        num_heads=64,
        num_kv_heads=8,
        head_dim=64,
        hidden_size=2880,
        intermediate_size=2880,
        vocab_size=201088,
        moe=MoeGeometry(num_experts=128, num_experts_per_tok=4, moe_intermediate_size=2880),
        expert_format="mxfp4",
        sliding_window=128,
        num_sliding_layers=18,
    ),
    # mistralai/Mixtral-8x22B-v0.1 config.json: 56 layers, 8 experts (num_local_experts) of 16,384, top-2,
    # GQA 48 q heads, 8 KV of 128; sliding_window null; vocabulary 32,000 (the Instruct-v0.1's is 32,768).
    # 141B parameters, 39B active (Mistral AI's announcement); MegaScale-Infer's (arXiv 2504.02263) model.
    ModelProfile(
        "mixtral-8x22b",
        num_layers=56,
        num_heads=48,
        num_kv_heads=8,
        head_dim=128,
        hidden_size=6144,
        intermediate_size=16384,
        vocab_size=32000,
        moe=MoeGeometry(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16384),
    ),
    # databricks/dbrx-base config.json (dbrx-instruct shares it): d_model 6,144, 40 layers (n_layers), 48
    # heads of 128, 8 KV heads (attn_config.kv_n_heads); 16 experts (ffn_config.moe_num_experts) of
    # 10,752 (ffn_hidden_size), top-4 (moe_top_k); vocabulary 100,352, untied. 132B parameters, 36B active
    # (its model card); MegaScale-Infer's (arXiv 2504.02263) model.
    ModelProfile(
        "dbrx",
        num_layers=40,
        num_heads=48,
        num_kv_heads=8,
        head_dim=128,
        hidden_size=6144,
        intermediate_size=10752,
        vocab_size=100352,
        moe=MoeGeometry(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=10752),
    ),
)
