"""Multi-head latent attention (DeepSeek-V2/V3's MLA): the geometry that sets its weights, KV and FLOPs.

Per layer, a token's keys and values are cached as one compressed latent of `kv_lora_rank` values plus
one shared rotary key of `qk_rope_head_dim` values (DeepSeek-V3: 512 + 64 = 576 values, 1,152 bytes
in BF16), the same for every head, so tensor parallelism cannot split it: each rank holds it whole
(vLLM replicates the MLA cache over TP ranks). Two ways to attend over it (vLLM runs both)::

    prefill (chunks): up-project the latent to per-head K (nope+rope) and V, then ordinary attention
        per query-key pair and head:  2·(qk_nope + qk_rope) + 2·v_head        FLOPs (DeepSeek-V3: 640)
        per cached context token:     2·kv_lora·H·(qk_nope + v_head)          (the up-projection)
    decode (absorbed): fold W_UK into the query and W_UV into the output, attend in latent space,
        one 576-wide key and 512-wide value shared by all heads (MQA-like):
        per query-key pair and head:  2·(kv_lora + qk_rope) + 2·kv_lora       FLOPs (DeepSeek-V3: 2,176)

Either way a new token's projections cost 2 FLOPs per attention weight (the absorbed W_UK and W_UV
have kv_b_proj's size), so only attention over keys differs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MlaGeometry:
    """MLA's sizes, Hugging Face config names (DeepseekV3Config)."""

    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    """None: queries projected directly from the hidden state (DeepSeek-V2-Lite)."""

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def attention_params(self, hidden_size: int, num_heads: int) -> int:
        """One layer's attention weights (and its two latent norms): q (down + up, or direct), the KV
        down projection with the rotary key, the KV up projection, the output projection."""
        h, nh = hidden_size, num_heads
        if self.q_lora_rank is None:
            q = h * nh * self.qk_head_dim
        else:
            q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * nh * self.qk_head_dim
        kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv_b = self.kv_lora_rank * nh * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv_a + kv_b + nh * self.v_head_dim * h

    @property
    def kv_values_per_token(self) -> int:
        """Cached values per token and layer: the latent and the shared rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def prefill_flops_per_key(self, num_heads: int) -> int:
        """One query attending to one key over all heads, in the up-projected (prefill) form."""
        return num_heads * (2 * self.qk_head_dim + 2 * self.v_head_dim)

    def decode_flops_per_key(self, num_heads: int) -> int:
        """One query attending to one key over all heads, in the absorbed (decode) form."""
        return num_heads * (2 * self.kv_values_per_token + 2 * self.kv_lora_rank)

    def context_flops_per_token(self, num_heads: int) -> int:
        """Up-projecting one cached context token's latent to K and V for a prefill chunk."""
        return 2 * self.kv_lora_rank * num_heads * (self.qk_nope_head_dim + self.v_head_dim)
