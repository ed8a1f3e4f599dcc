"""Hybrid target models: layers that remember by a fixed-size state (Mamba2, gated delta net) beside
layers that attend, from each model's public config.json.

    nemotron-3-nano-30b-a3b   nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B: hybrid_override_pattern, 52 blocks
                              (23 Mamba2 M, 23 MoE E, 6 attention *); hidden 2,688, vocabulary 131,072,
                              untied; mamba_num_heads 64, mamba_head_dim 64, n_groups 8, ssm_state_size
                              128, conv_kernel 4, chunk_size 128; 32 heads, 2 KV heads of 128; 128 routed
                              experts of 1,856 (squared ReLU: up and down only), top 6, one shared of
                              3,712. 31.6B parameters, 3.2B active without embeddings (model card)
    qwen3-next-80b-a3b        Qwen/Qwen3-Next-80B-A3B-Instruct: 48 layers, every 4th full attention (16
                              heads of 256 with an output gate, 2 KV heads), 36 gated delta nets (16 key
                              heads, 32 value heads of 128, conv 4); hidden 2,048; every layer MoE: 512
                              experts of 512, top 10, one shared of 512; vocabulary 151,936, untied
    granite-4.0-h-tiny        ibm-granite/granite-4.0-h-tiny: 40 layers, attention at 5, 15, 25, 35 (12
                              heads, 4 KV heads of 128), 36 Mamba2 (48 heads of 64, 1 group, state 128,
                              conv 4, chunk 256); hidden 1,536; every layer MoE: 64 experts of 512, top 6,
                              a shared MLP of 1,024; vocabulary 100,352, tied

The configs were read from copies that quote them (the model hub is out of reach here); transformers'
`Qwen3NextConfig` defaults are documented as that checkpoint's and agree. State dtypes as vLLM's
defaults: Nemotron-H's recurrent state in float32 (`NemotronHForCausalLMConfig`), the others in the
model's bfloat16. `tests/test_hybrid_profiles.py` builds transformers' own mixers and layer orders from
the same values. Left out: biases, norms, the conv filters and Mamba's per-head A, D and dt bias (under
0.1 % of the parameters), Qwen3-Next's shared-expert gate (one weight a hidden unit).
"""

from __future__ import annotations

from typing import Literal

from emulation.model_profile import ModelProfile
from emulation.moe import MoeGeometry
from emulation.ssm import GatedDeltaNetGeometry, Mamba2Geometry

LayerType = Literal["ssm", "attention", "moe", "mlp"]


def _pattern(pattern: str) -> tuple[LayerType, ...]:
    """Nemotron-H's hybrid_override_pattern: M Mamba2, * attention, E MoE, - MLP."""
    kinds: dict[str, LayerType] = {"M": "ssm", "*": "attention", "E": "moe", "-": "mlp"}
    return tuple(kinds[c] for c in pattern)


NEMOTRON_3_NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"

LAYER_TYPES: dict[str, tuple[LayerType, ...]] = {
    "nemotron-3-nano-30b-a3b": _pattern(NEMOTRON_3_NANO_PATTERN),
    "qwen3-next-80b-a3b": ("ssm", "ssm", "ssm", "attention") * 12,
    "granite-4.0-h-tiny": tuple("attention" if i in (5, 15, 25, 35) else "ssm" for i in range(40)),
}
"""Each model's token mixers in order (Nemotron-H: every block, its MoE blocks too)."""


def _mixers(name: str) -> tuple[int, int]:
    """(token-mixer layers, of them SSM layers) of model `name`."""
    kinds = LAYER_TYPES[name]
    return kinds.count("ssm") + kinds.count("attention"), kinds.count("ssm")


HYBRID_MODELS: tuple[ModelProfile, ...] = (
    ModelProfile(
        "nemotron-3-nano-30b-a3b",
        num_layers=_mixers("nemotron-3-nano-30b-a3b")[0],
        num_heads=32,
        num_kv_heads=2,
        head_dim=128,
        hidden_size=2688,
        intermediate_size=0,  # the 6 attention blocks are followed by no MLP block
        vocab_size=131072,
        moe=MoeGeometry(
            num_experts=128,
            num_experts_per_tok=6,
            moe_intermediate_size=1856,
            shared_expert_intermediate_size=3712,
            num_dense_layers=6,
            num_projections=2,
        ),
        ssm=Mamba2Geometry(
            num_heads=64,
            head_dim=64,
            n_groups=8,
            state_size=128,
            conv_kernel=4,
            chunk_size=128,
            ssm_dtype_bytes=4,
        ),
        num_ssm_layers=_mixers("nemotron-3-nano-30b-a3b")[1],
    ),
    ModelProfile(
        "qwen3-next-80b-a3b",
        num_layers=48,
        num_heads=16,
        num_kv_heads=2,
        head_dim=256,
        hidden_size=2048,
        intermediate_size=5632,
        vocab_size=151936,
        moe=MoeGeometry(
            num_experts=512,
            num_experts_per_tok=10,
            moe_intermediate_size=512,
            shared_expert_intermediate_size=512,
        ),
        ssm=GatedDeltaNetGeometry(
            num_key_heads=16, num_value_heads=32, key_head_dim=128, value_head_dim=128, conv_kernel=4
        ),
        num_ssm_layers=_mixers("qwen3-next-80b-a3b")[1],
        attention_output_gate=True,
    ),
    ModelProfile(
        "granite-4.0-h-tiny",
        num_layers=40,
        num_heads=12,
        num_kv_heads=4,
        head_dim=128,
        hidden_size=1536,
        intermediate_size=512,
        vocab_size=100352,
        tie_word_embeddings=True,
        moe=MoeGeometry(
            num_experts=64,
            num_experts_per_tok=6,
            moe_intermediate_size=512,
            shared_expert_intermediate_size=1024,
        ),
        ssm=Mamba2Geometry(
            num_heads=48, head_dim=64, n_groups=1, state_size=128, conv_kernel=4, chunk_size=256
        ),
        num_ssm_layers=_mixers("granite-4.0-h-tiny")[1],
    ),
)
