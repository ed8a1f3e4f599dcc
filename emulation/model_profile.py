"""A target model's geometry, from its Hugging Face config values: what the time models and the KV
cache read (weights, KV per token, attention FLOPs per key), dense or mixture-of-experts, GQA or MLA.

Per layer::

    attention   GQA: h·(q + 2·kv) + q·h        (q = heads·head_dim, kv = kv_heads·head_dim)
                MLA: emulation.mla.MlaGeometry.attention_params
    MLP         dense layers: 3·h·i            MoE layers: router + shared experts + E routed experts

Biases, norms and attention sinks (gpt-oss: one logit a head) are left out: under 0.1 % of any
profile's parameters and FLOPs. Sliding-window layers attend over at most `sliding_window` keys
(`layer_mean_keys`); with vLLM's hybrid KV cache manager they keep only their window's blocks
(`kv_cache_groups`, `actors/engine/kv_cache/sliding_window.py`).

Hybrid models (`ssm`): of the num_layers token mixers, num_ssm_layers are state-space layers (Mamba2 or
gated delta nets, `emulation.ssm`) with a fixed-size state a request instead of KV; the rest attend.
Only the attention layers hold KV and attend; the SSM layers' projections are GEMM weights beside them
(`num_mixer_params`) and their scan a group of its own (`ssm_work`). Nemotron-H interleaves mixer and
MLP blocks; it is counted as num_layers mixers of which num_moe_layers are followed by a MoE block and
the rest by none (`moe.num_dense_layers` with intermediate_size 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from emulation.mla import MlaGeometry
from emulation.moe import MoeGeometry
from emulation.quantization import FORMATS, WeightFormat
from emulation.ssm import (
    HybridPage,
    KVCacheGroups,
    SsmGeometry,
    group_size,
    hybrid_page,
    kv_cache_groups,
    scan_work,
)


@dataclass(frozen=True)
class ModelProfile:
    """A target model's geometry (the derived counts are cached: the time models read them at every
    step, and a frozen profile never changes them)."""

    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    """The dense MLP's width (MoE models: of their dense layers, if any)."""
    vocab_size: int
    tie_word_embeddings: bool = False
    dtype_bytes: int = 2
    """Bytes per activation element (bf16), and per embedding and LM-head weight."""
    vision_encoder: str | None = None
    """Its vision encoder, a name from emulation.vision.VISION_ENCODERS (None: text only)."""
    moe: MoeGeometry | None = None
    """Mixture of experts (None: every layer's MLP is dense)."""
    mla: MlaGeometry | None = None
    """Multi-head latent attention (None: grouped-query attention of num_kv_heads x head_dim)."""
    weight_format: WeightFormat = "bf16"
    """How the decoder layers' weights are stored (emulation.quantization: their bytes and the tensor
    cores their GEMMs run on); embeddings and LM head stay at dtype_bytes."""
    expert_format: WeightFormat = "bf16"
    """How the routed experts' weights are stored (gpt-oss: MXFP4; a dense model: not read)."""
    kv_dtype_bytes: int = 2
    """Bytes per KV cache element (vLLM's --kv-cache-dtype: 2 auto/bf16, 1 fp8)."""
    sliding_window: int | None = None
    """Keys a query of a sliding-window layer attends to at most (gpt-oss: 128)."""
    num_sliding_layers: int = 0
    """Of num_layers, those attending over the sliding window (the rest attend to every key)."""
    ssm: SsmGeometry | None = None
    """Hybrid models: the state-space mixer of num_ssm_layers of the layers (None: every layer attends)."""
    num_ssm_layers: int = 0
    """Of num_layers, those whose mixer is `ssm` (a state a request, no KV)."""
    attention_output_gate: bool = False
    """Qwen3-Next: q_proj also projects a sigmoid gate on the attention output (as wide as the queries)."""

    @cached_property
    def num_attention_layers(self) -> int:
        """Layers that attend and hold KV."""
        return self.num_layers - self.num_ssm_layers

    @cached_property
    def attention_params(self) -> int:
        """One attention layer's weights."""
        if self.mla is not None:
            return self.mla.attention_params(self.hidden_size, self.num_heads)
        q = self.num_heads * self.head_dim * (2 if self.attention_output_gate else 1)
        kv = self.num_kv_heads * self.head_dim
        return self.hidden_size * (q + 2 * kv) + self.num_heads * self.head_dim * self.hidden_size

    @cached_property
    def ssm_params(self) -> int:
        """One SSM layer's projections (0 without SSM layers)."""
        return 0 if self.ssm is None else self.ssm.projection_params(self.hidden_size)

    @cached_property
    def num_mixer_params(self) -> int:
        """Every layer's token mixer: attention, or an SSM's projections."""
        return self.num_attention_layers * self.attention_params + self.num_ssm_layers * self.ssm_params

    @cached_property
    def num_all_reduces(self) -> int:
        """Tensor-parallel all-reduces a forward pass makes: after each mixer and each MLP block (2 a
        layer; Nemotron-H: one a block)."""
        mlp_blocks = self.num_moe_layers + (self.num_dense_mlp_layers if self.intermediate_size else 0)
        return self.num_layers + mlp_blocks

    @cached_property
    def dense_mlp_params(self) -> int:
        """One dense MLP: gate, up and down projections."""
        return 3 * self.hidden_size * self.intermediate_size

    @cached_property
    def num_dense_mlp_layers(self) -> int:
        return self.num_layers if self.moe is None else self.moe.num_dense_layers

    @cached_property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_mlp_layers

    @cached_property
    def num_shared_params(self) -> int:
        """Every MoE layer's router and shared experts, over all layers (every token runs them)."""
        return 0 if self.moe is None else self.num_moe_layers * self.moe.shared_params(self.hidden_size)

    @cached_property
    def num_routed_params(self) -> int:
        """Every routed expert of every MoE layer."""
        if self.moe is None:
            return 0
        return self.num_moe_layers * self.moe.num_experts * self.moe.expert_params(self.hidden_size)

    @cached_property
    def num_dense_params(self) -> int:
        """Layer weights every token reads and computes: attention, dense MLPs, routers, shared experts."""
        return (
            self.num_mixer_params + self.num_dense_mlp_layers * self.dense_mlp_params + self.num_shared_params
        )

    @cached_property
    def num_layer_params(self) -> int:
        return self.num_dense_params + self.num_routed_params

    @cached_property
    def num_active_layer_params(self) -> int:
        """Layer weights one token computes with: the dense ones and top_k routed experts a layer."""
        if self.moe is None:
            return self.num_layer_params
        routed = self.num_moe_layers * self.moe.num_experts_per_tok * self.moe.expert_params(self.hidden_size)
        return self.num_dense_params + routed

    @cached_property
    def num_head_params(self) -> int:
        """LM-head parameters: read every step, multiplied only for tokens that need logits."""
        return self.vocab_size * self.hidden_size

    @cached_property
    def num_params(self) -> int:
        embeddings = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self.num_layer_params + self.num_head_params + embeddings

    @property
    def weight_bytes_per_layer_param(self) -> float:
        return FORMATS[self.weight_format].bytes_per_weight

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes per routed-expert weight."""
        return FORMATS[self.expert_format].bytes_per_weight

    @cached_property
    def routed_weight_bytes(self) -> float:
        """All routed experts' bytes (0 for a dense model)."""
        return self.num_routed_params * self.expert_weight_bytes

    @cached_property
    def weight_bytes(self) -> float:
        """Bytes resident on the GPU(s): every parameter, embeddings included."""
        embeddings = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self.step_weight_bytes + self.routed_weight_bytes + embeddings * self.dtype_bytes

    @cached_property
    def step_weight_bytes(self) -> float:
        """Weight bytes every forward pass streams: the dense layer weights and the LM head (an
        embedding lookup reads a few rows; routed experts are read only where tokens go: moe)."""
        return (
            self.num_dense_params * self.weight_bytes_per_layer_param
            + self.num_head_params * self.dtype_bytes
        )

    @cached_property
    def kv_bytes_per_token(self) -> int:
        """One token's KV over the attention layers (SSM layers hold none)."""
        if self.mla is not None:
            return self.num_attention_layers * self.mla.kv_values_per_token * self.kv_dtype_bytes
        return 2 * self.num_attention_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes

    def kv_bytes_per_token_per_gpu(self, tp: int) -> float:
        """One token's KV on each of `tp` GPUs: its share of the KV heads, at least one head (past
        num_kv_heads ranks, heads are replicated, as vLLM does); MLA's latent is whole on each."""
        if self.mla is not None:
            return float(self.kv_bytes_per_token)
        return self.kv_bytes_per_token * math.ceil(self.num_kv_heads / tp) / self.num_kv_heads

    def layer_mean_keys(self, keys: float, num_queries: float) -> float:
        """Of `keys` that `num_queries` queries attend to (or KV tokens they read), what a layer attends
        on average: all of them in full-attention layers, at most the window a query in sliding ones::

            (full layers · keys + sliding layers · min(keys, queries · window)) / layers

        Over a step's requests Σ_r Σ_i min(c_r + i + 1, W) <= min(Σ K_r, W·Σ n_r): an upper bound, above
        the exact count by at most W(W-1)/2 query-key pairs a request whose keys start inside the window
        (8,128 for W = 128: a chunk at its prompt's start, a decode shorter than the window); exact once
        every query sees a full window. Elementwise on a window's arrays."""
        if not self.num_sliding_layers:
            return keys
        assert self.sliding_window is not None
        windowed = np.minimum(keys, num_queries * self.sliding_window)
        layers = self.num_attention_layers
        full = layers - self.num_sliding_layers
        return (full * keys + self.num_sliding_layers * windowed) / layers  # type: ignore[no-any-return]

    @cached_property
    def prefill_attention_flops_per_key(self) -> float:
        """FLOPs of one new token of a prompt chunk attending to one key, over heads and layers."""
        if self.mla is not None:
            return float(self.num_attention_layers * self.mla.prefill_flops_per_key(self.num_heads))
        return 4.0 * self.num_heads * self.head_dim * self.num_attention_layers

    @cached_property
    def decode_attention_flops_per_key(self) -> float:
        """FLOPs of one decoding token attending to one key, over heads and layers."""
        if self.mla is not None:
            return float(self.num_attention_layers * self.mla.decode_flops_per_key(self.num_heads))
        return self.prefill_attention_flops_per_key

    @cached_property
    def context_flops_per_token(self) -> float:
        """FLOPs a prompt chunk spends per cached context token before attending (MLA's up-projection
        of the latent; none for GQA), over layers."""
        if self.mla is None:
            return 0.0
        return float(self.num_attention_layers * self.mla.context_flops_per_token(self.num_heads))

    def state_bytes_per_layer(self, tp: int = 1) -> int:
        """One request's state in one SSM layer on one of `tp` ranks (0 without SSM layers)."""
        return 0 if self.ssm is None else self.ssm.state(tp, self.dtype_bytes).nbytes

    def state_bytes_per_gpu(self, tp: int = 1) -> int:
        """One request's state over every SSM layer on one of `tp` ranks: what a P/D handoff ships of
        it a rank, whatever the prompt's length."""
        return self.num_ssm_layers * self.state_bytes_per_layer(tp)

    def kv_bytes_per_token_per_layer(self, tp: int = 1) -> float:
        """One token's KV in one attention layer on one of `tp` ranks."""
        return self.kv_bytes_per_token_per_gpu(tp) / self.num_attention_layers

    def page(self, tp: int = 1, block_size: int = 16) -> HybridPage:
        """vLLM's one page size for a hybrid model at `tp` (`ssm.hybrid_page`); a model without SSM
        layers keeps `block_size`."""
        attention = int(self.kv_bytes_per_token_per_layer(tp))
        if self.ssm is None:
            return HybridPage(block_size, block_size * attention, 0)
        return hybrid_page(self.state_bytes_per_layer(tp), attention, block_size)

    @cached_property
    def kv_cache_groups(self) -> KVCacheGroups:
        """vLLM's KV cache groups (`ssm.kv_cache_groups`): a hybrid's attention and Mamba groups, a
        sliding-window model's full and sliding ones, else one group of all its layers."""
        if self.ssm is not None:
            return kv_cache_groups(self.num_attention_layers, self.num_ssm_layers)
        if self.num_sliding_layers:
            full, sliding = self.num_attention_layers - self.num_sliding_layers, self.num_sliding_layers
            size = group_size(full, sliding)
            return KVCacheGroups(size, -(-full // size), 0, -(-sliding // size))
        return KVCacheGroups(self.num_layers, 1, 0)

    def state_crossover_tokens(self, tp: int = 1) -> float:
        """Prompt tokens past which the model's states weigh less than its attention KV (a P/D handoff
        ships both: KV grows with the prompt, a state does not)."""
        return self.state_bytes_per_gpu(tp) / self.kv_bytes_per_token_per_gpu(tp)

    def ssm_work(self, num_prefill_tokens: float, num_chunks: float, num_decodes: float, tp: int = 1
                 ) -> tuple[float, float]:  # fmt: skip
        """FLOPs and bytes on one of `tp` GPUs of the SSM layers' scans in a step of `num_prefill_tokens`
        in `num_chunks` prompt chunks and `num_decodes` decodes (`ssm.scan_work`; (0, 0) without them)."""
        if self.ssm is None:
            return 0.0, 0.0
        return scan_work(self.ssm, self.num_ssm_layers, self.dtype_bytes, num_prefill_tokens, num_chunks,
                         num_decodes, tp)  # fmt: skip
