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

from emulation.kv_cache import cdiv

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
    ssm_dtype_bytes: int = 2
    kind: Literal["mamba2"] = "mamba2"

    def state(self, tp: int, dtype_bytes: int = 2) -> StateShape:
        """One request's state on one of `tp` ranks (`dtype_bytes`: the model's, the conv buffer's)."""
        groups = self.n_groups if self.n_groups % tp == 0 else tp  # vLLM: extra_groups_for_head_shards
        conv_dim = self.num_heads * self.head_dim + 2 * groups * self.state_size
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
    ssm_dtype_bytes: int = 2
    kind: Literal["gated_delta_net"] = "gated_delta_net"

    def state(self, tp: int, dtype_bytes: int = 2) -> StateShape:
        conv_dim = 2 * self.key_head_dim * self.num_key_heads + self.value_head_dim * self.num_value_heads
        return StateShape(
            (self.conv_kernel - 1, conv_dim // tp),
            (self.num_value_heads // tp, self.value_head_dim, self.key_head_dim),
            dtype_bytes,
            self.ssm_dtype_bytes,
        )


SsmGeometry = Mamba2Geometry | GatedDeltaNetGeometry


@dataclass(frozen=True)
class HybridPage:
    """vLLM's one page size for a hybrid model's layers (the module docstring)."""

    block_size: int
    """Tokens an attention block holds, raised so that its page holds one layer's state."""
    page_bytes: int
    """Bytes of every page: an attention block's KV, or one layer's state padded to it."""
    padding_bytes: int
    """Of a state page, what no state fills (allocated, never sent)."""


def hybrid_page(state_bytes: int, attention_bytes_per_token: int, block_size: int = 16) -> HybridPage:
    """The page for a layer state of `state_bytes` beside attention layers of `attention_bytes_per_token`
    a rank (KV, both K and V), the configured `block_size` the least (vLLM's none and align modes)."""
    align = max(MIN_ATTENTION_BLOCK, block_size)
    raised = max(block_size, align * cdiv(state_bytes, align * attention_bytes_per_token))
    page = raised * attention_bytes_per_token
    return HybridPage(raised, page, page - state_bytes)
