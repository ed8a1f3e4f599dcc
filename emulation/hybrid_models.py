"""Hybrid models' layer geometry: which layers remember by a fixed-size state (Mamba2, gated delta net)
and which by KV per token (attention), from each model's public config.json.

    nemotron-3-nano-30b-a3b   nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B: hybrid_override_pattern, 52 blocks
                              (23 Mamba2 M, 23 MoE E, 6 attention *); mamba_num_heads 64, mamba_head_dim 64,
                              n_groups 8, ssm_state_size 128, conv_kernel 4; 2 KV heads of 128
    qwen3-next-80b-a3b        Qwen/Qwen3-Next-80B-A3B-Instruct: 48 layers, every 4th full attention (16
                              heads, 2 KV heads of 256), 36 gated delta nets (16 key heads, 32 value heads
                              of 128, conv 4)
    granite-4.0-h-tiny        ibm-granite/granite-4.0-h-tiny: 40 layers, attention at 5, 15, 25, 35 (4 KV
                              heads of 128), 36 Mamba2 (48 heads of 64, 1 group, state 128, conv 4); each
                              layer's mixer listed (every layer also has a MoE MLP)

The configs were read from copies that quote them (no stored copy of the files themselves: the model hub
is out of reach here); transformers' `Qwen3NextConfig` defaults are documented as that checkpoint's and
agree. State dtypes as vLLM's defaults: Nemotron-H's recurrent state in float32
(`NemotronHForCausalLMConfig`), the others in the model's bfloat16. `tests/test_hybrid_profiles.py` builds
transformers' own mixers from the same values. Not yet a `ModelProfile` (their step time and hybrid cache
manager come next): what each layer keeps per request, and vLLM's page size for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from emulation.ssm import GatedDeltaNetGeometry, HybridPage, Mamba2Geometry, SsmGeometry, hybrid_page

LayerType = Literal["ssm", "attention", "moe", "mlp"]


@dataclass(frozen=True)
class HybridGeometry:
    """A hybrid model's layers (`layer_types`, in order) and what each kind keeps per request."""

    name: str
    layer_types: tuple[LayerType, ...]
    ssm: SsmGeometry
    num_kv_heads: int
    head_dim: int
    """Of the attention layers."""
    dtype_bytes: int = 2

    @property
    def num_ssm_layers(self) -> int:
        return self.layer_types.count("ssm")

    @property
    def num_attention_layers(self) -> int:
        return self.layer_types.count("attention")

    def state_bytes(self, tp: int = 1) -> int:
        """One SSM layer's state for one request on one of `tp` ranks."""
        return self.ssm.state(tp, self.dtype_bytes).nbytes

    def attention_bytes_per_token(self, tp: int = 1) -> int:
        """One attention layer's KV for one token on one of `tp` ranks (KV heads replicated when tp
        exceeds them, as vLLM does)."""
        return 2 * max(1, self.num_kv_heads // tp) * self.head_dim * self.dtype_bytes

    def page(self, tp: int = 1, block_size: int = 16) -> HybridPage:
        """vLLM's one page size for this model at `tp` (`ssm.hybrid_page`)."""
        return hybrid_page(self.state_bytes(tp), self.attention_bytes_per_token(tp), block_size)

    def crossover_tokens(self, tp: int = 1) -> float:
        """Prompt tokens past which the whole model's states weigh less than its attention KV (what a P/D
        handoff ships: KV grows with the prompt, a state does not)."""
        states = self.num_ssm_layers * self.state_bytes(tp)
        return states / (self.num_attention_layers * self.attention_bytes_per_token(tp))


def _pattern(pattern: str) -> tuple[LayerType, ...]:
    """Nemotron-H's hybrid_override_pattern: M Mamba2, * attention, E MoE, - MLP."""
    kinds: dict[str, LayerType] = {"M": "ssm", "*": "attention", "E": "moe", "-": "mlp"}
    return tuple(kinds[c] for c in pattern)


NEMOTRON_3_NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"

HYBRID_MODELS: dict[str, HybridGeometry] = {
    g.name: g
    for g in (
        HybridGeometry(
            "nemotron-3-nano-30b-a3b",
            _pattern(NEMOTRON_3_NANO_PATTERN),
            Mamba2Geometry(
                num_heads=64, head_dim=64, n_groups=8, state_size=128, conv_kernel=4, ssm_dtype_bytes=4
            ),
            num_kv_heads=2,
            head_dim=128,
        ),
        HybridGeometry(
            "qwen3-next-80b-a3b",
            ("ssm", "ssm", "ssm", "attention") * 12,
            GatedDeltaNetGeometry(
                num_key_heads=16, num_value_heads=32, key_head_dim=128, value_head_dim=128, conv_kernel=4
            ),
            num_kv_heads=2,
            head_dim=256,
        ),
        HybridGeometry(
            "granite-4.0-h-tiny",
            tuple("attention" if i in (5, 15, 25, 35) else "ssm" for i in range(40)),
            Mamba2Geometry(num_heads=48, head_dim=64, n_groups=1, state_size=128, conv_kernel=4),
            num_kv_heads=4,
            head_dim=128,
        ),
    )
}
