"""State-space (Mamba2) and gated-delta-net layers of hybrid models: the fixed-size state one request
keeps per layer, and vLLM's rule for the one page size its hybrid KV cache manager shares with attention.

A Mamba2 layer remembers the past as a convolution buffer and a recurrent state, each sharded over the
tensor-parallel ranks (vLLM's `MambaStateShapeCalculator`, `model_executor/layers/mamba/mamba_utils.py`)::

    n_groups'  = n_groups, or tp when tp does not divide it (the groups replicated over the head shards)
    conv_dim   = num_heads · head_dim + 2 · n_groups' · state_size        ([x | B | C] channels)
    conv       (conv_kernel - 1, conv_dim / tp)                           the last K-1 inputs (SD layout;
                                                                          DS, for a P/D TP change: transposed)
    ssm        (num_heads / tp, head_dim, state_size)                     the recurrent state

A gated delta net (Qwen3-Next's linear attention) alike: conv_dim = 2 · key_heads · key_dim + value_heads ·
value_dim, ssm (value_heads / tp, value_dim, key_dim). The conv buffer takes the model's dtype; the
recurrent state its own (vLLM's Nemotron-H default: float32, "the only one known to have no accuracy
issues"; others the conv's).

Compute, per layer and new token (all heads; a rank runs 1/tp of them), multiply-adds counted twice::

    Mamba2 chunked scan (SSD, chunk Q)  H·(Q+1)·P + G·(Q+1)·N + 4·H·N·P     causal scores C·Bᵀ within a chunk
                                                                          (a token sees (Q+1)/2 on average),
                                                                          their product with X, the chunk's
                                                                          state B⊗X and the output C·state
    Mamba2 decode (one token)           5·H·P·N                           decay and B⊗x into the state, C·h
    gated delta net chunked (chunk Q)   Hv·((Q+1)·(Dk+Dv) + 6·Dk·Dv)      q·kᵀ and its product with v within a
                                                                          chunk; k·S, the delta update, q·S
    gated delta net decode              7·Hv·Dk·Dv                        k·S, the rank-1 update, q·S
    convolution                         2·K·conv_dim                      a depthwise filter of K taps

(H heads of P, N state, G groups; Hv value heads of Dv, Dk key dim; K conv_kernel). The projections
around the mixer are GEMMs (`projection_params`). Bytes: a request's state is read and written once a
step (a decode's whole work is that traffic), and a chunked scan also writes and reads back the state
at every chunk boundary (its kernels pass chunk states through memory).

One page size (vLLM's `_align_hybrid_block_size`, docs/design/hybrid_kv_cache_manager.md): the attention
block size is raised until one block's KV holds a layer's state, the state's page padded to it::

    attention page per token  p = 2 · kv_heads a rank · head_dim · dtype bytes
    block_size = align · cdiv(state bytes, align · p)          align = max(16, the configured block size)
    padding    = block_size · p - state bytes
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

MIN_ATTENTION_BLOCK = 16
"""The smallest block size the attention kernels take (vLLM's FlashAttention: multiples of 16)."""


@dataclass(frozen=True)
class StateShape:
    """One request's state in one layer on one tensor-parallel rank."""

    conv: tuple[int, int]
    """(conv_kernel - 1, conv channels a rank): vLLM's SD layout."""
    ssm: tuple[int, int, int]
    conv_dtype_bytes: int
    ssm_dtype_bytes: int

    @property
    def conv_bytes(self) -> int:
        return math.prod(self.conv) * self.conv_dtype_bytes

    @property
    def ssm_bytes(self) -> int:
        return math.prod(self.ssm) * self.ssm_dtype_bytes

    @property
    def nbytes(self) -> int:
        """What a handoff ships of this layer for one request (no page padding)."""
        return self.conv_bytes + self.ssm_bytes


@dataclass(frozen=True)
class Mamba2Geometry:
    """A Mamba2 mixer, from a model's config.json (Nemotron-H: mamba_num_heads, mamba_head_dim, n_groups,
    ssm_state_size, conv_kernel; Granite-4.0-H: mamba_n_heads, mamba_d_head, mamba_n_groups,
    mamba_d_state, mamba_d_conv)."""

    num_heads: int
    head_dim: int
    n_groups: int
    state_size: int
    conv_kernel: int
    chunk_size: int
    """Tokens per chunk of the chunked scan (chunk_size, mamba_chunk_size)."""
    ssm_dtype_bytes: int = 2
    kind: Literal["mamba2"] = "mamba2"
    exports_prefill_checkpoint: bool = True
    """A step can export the state at a block boundary inside its chunk (vLLM's Mamba2 layers), so the
    scheduler need not split a prompt at its checkpoint."""

    @property
    def conv_dim(self) -> int:
        return self.num_heads * self.head_dim + 2 * self.n_groups * self.state_size

    def projection_params(self, hidden_size: int) -> int:
        """in_proj (to z, x, B, C and dt) and out_proj: the mixer's GEMM weights."""
        inner = self.num_heads * self.head_dim
        return hidden_size * (inner + self.conv_dim + self.num_heads) + inner * hidden_size

    @property
    def prefill_flops_per_token(self) -> float:
        h, p, n, q = self.num_heads, self.head_dim, self.state_size, self.chunk_size
        scan = h * (q + 1) * p + self.n_groups * (q + 1) * n + 4 * h * n * p
        return float(scan + 2 * self.conv_kernel * self.conv_dim)

    @property
    def decode_flops_per_token(self) -> float:
        h, p, n = self.num_heads, self.head_dim, self.state_size
        return float(5 * h * p * n + 2 * self.conv_kernel * self.conv_dim)

    def state(self, tp: int, dtype_bytes: int = 2) -> StateShape:
        """One request's state on one of `tp` ranks (`dtype_bytes`: the model's, the conv buffer's)."""
        groups = self.n_groups if self.n_groups % tp == 0 else tp  # vLLM: extra_groups_for_head_shards
        conv_dim = self.conv_dim + 2 * (groups - self.n_groups) * self.state_size
        return StateShape(
            (self.conv_kernel - 1, conv_dim // tp),
            (self.num_heads // tp, self.head_dim, self.state_size),
            dtype_bytes,
            self.ssm_dtype_bytes,
        )


@dataclass(frozen=True)
class GatedDeltaNetGeometry:
    """A gated delta net (Qwen3-Next's linear attention): linear_num_key_heads, linear_num_value_heads,
    linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    chunk_size: int = 64
    """Tokens per chunk of the chunked delta rule (vLLM's and transformers' kernels: 64)."""
    ssm_dtype_bytes: int = 2
    kind: Literal["gated_delta_net"] = "gated_delta_net"
    exports_prefill_checkpoint: bool = False
    """vLLM's Triton/FLA gated-delta-net kernels cannot (its FlashInfer prefill backend can)."""

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_head_dim * self.num_key_heads + self.value_head_dim * self.num_value_heads

    def projection_params(self, hidden_size: int) -> int:
        """in_proj_qkvz, in_proj_ba (a decay and a beta a value head) and out_proj."""
        values = self.value_head_dim * self.num_value_heads
        return hidden_size * (self.conv_dim + values + 2 * self.num_value_heads) + values * hidden_size

    @property
    def prefill_flops_per_token(self) -> float:
        dk, dv, q = self.key_head_dim, self.value_head_dim, self.chunk_size
        scan = self.num_value_heads * ((q + 1) * (dk + dv) + 6 * dk * dv)
        return float(scan + 2 * self.conv_kernel * self.conv_dim)

    @property
    def decode_flops_per_token(self) -> float:
        dk, dv = self.key_head_dim, self.value_head_dim
        return float(7 * self.num_value_heads * dk * dv + 2 * self.conv_kernel * self.conv_dim)

    def state(self, tp: int, dtype_bytes: int = 2) -> StateShape:
        return StateShape(
            (self.conv_kernel - 1, self.conv_dim // tp),
            (self.num_value_heads // tp, self.value_head_dim, self.key_head_dim),
            dtype_bytes,
            self.ssm_dtype_bytes,
        )


SsmGeometry = Mamba2Geometry | GatedDeltaNetGeometry


def scan_work(
    ssm: SsmGeometry,
    num_layers: int,
    dtype_bytes: int,
    num_prefill_tokens: float,
    num_chunks: float,
    num_decodes: float,
    tp: int = 1,
) -> tuple[float, float]:
    """FLOPs and bytes on one of `tp` GPUs of `num_layers` SSM layers' scans in a step of
    `num_prefill_tokens` in `num_chunks` prompt chunks and `num_decodes` decodes (the module's counts).
    Each request reads and writes its state; a chunk also passes a state through memory at each of its
    chunk boundaries (at least one a chunk). Elementwise on a window's arrays."""
    flops = num_layers / tp * (ssm.prefill_flops_per_token * num_prefill_tokens
                               + ssm.decode_flops_per_token * num_decodes)  # fmt: skip
    state = ssm.state(tp, dtype_bytes)
    chunk_states = np.maximum(num_chunks, num_prefill_tokens / ssm.chunk_size)
    nbytes = num_layers * 2 * (state.nbytes * (num_chunks + num_decodes) + state.ssm_bytes * chunk_states)
    return flops, nbytes


@dataclass(frozen=True)
class HybridPage:
    """vLLM's one page size for a hybrid model's layers (the module docstring)."""

    block_size: int
    """Tokens an attention block holds, raised so that its page holds one layer's state."""
    page_bytes: int
    """Bytes of every page: an attention block's KV, or one layer's state padded to it."""
    padding_bytes: int
    """Of a state page, what no state fills (allocated, never sent)."""


@dataclass(frozen=True)
class KVCacheGroups:
    """vLLM's KV cache groups of a model with two kinds of layer (`_get_kv_cache_groups_uniform_page_size`):
    each kind is cut into groups of `group_size` layers; a block id belongs to one group at a time and
    holds a page in each of its layers, so a block costs group_size pages (a short group's slot is
    unused)::

        group_size = min(full attention, other layers), or the larger if it is under 1.5x the smaller
        Nemotron-3-Nano  6 attention + 23 Mamba   -> 6: 1 attention group, 4 Mamba groups (6 6 6 5)
        Qwen3-Next       12 attention + 36 GDN    -> 12: 1 + 3
        Granite-4.0-H    4 attention + 36 Mamba   -> 4: 1 + 9
        gpt-oss-120b     18 full + 18 sliding     -> 18: 1 + 1 sliding-window group
    """

    group_size: int
    num_attention_groups: int
    """Full-attention groups."""
    num_state_groups: int
    """Mamba groups: a request holds one running-state block in each."""
    num_sliding_groups: int = 0
    """Sliding-window groups: a request holds a block in each for every position of its window."""


def kv_cache_groups(num_attention_layers: int, num_ssm_layers: int) -> KVCacheGroups:
    """A hybrid's groups: `num_attention_layers` full-attention layers beside `num_ssm_layers`."""
    size = group_size(num_attention_layers, num_ssm_layers)
    return KVCacheGroups(size, -(-num_attention_layers // size), -(-num_ssm_layers // size))


def group_size(num_layers: int, num_other_layers: int) -> int:
    """Layers a group of two kinds holds (`KVCacheGroups`)."""
    smaller, larger = sorted((num_layers, num_other_layers))
    return larger if larger < 1.5 * smaller else smaller


def hybrid_page(state_bytes: int, attention_bytes_per_token: int, block_size: int = 16) -> HybridPage:
    """The page for a layer state of `state_bytes` beside attention layers of `attention_bytes_per_token`
    a rank (KV, both K and V), the configured `block_size` the least (vLLM's none and align modes)."""
    align = max(MIN_ATTENTION_BLOCK, block_size)
    raised = max(block_size, align * -(-state_bytes // (align * attention_bytes_per_token)))  # cdiv
    page = raised * attention_bytes_per_token
    return HybridPage(raised, page, page - state_bytes)
