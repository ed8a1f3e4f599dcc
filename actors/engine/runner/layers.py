"""How one decoder layer computes, per architecture: its attention inputs and its MLP, on the packed batch.

The runner packs every token of a step into one `[num_tokens, hidden]` batch and does the attention
itself (`runner.py`); between the two, each architecture applies its own modules in its own order::

    Qwen2       q, k, v = q_proj(h), k_proj(h), v_proj(h)   (biases: the Linear modules')
                q, k = rotary(q, k)
    Qwen3-MoE   q, k = q_norm(q_proj(h)), k_norm(k_proj(h))  RMSNorm over head_dim, per head, BEFORE
                q, k = rotary(q, k)                          the rotation; no biases; head_dim explicit

    MLP         Qwen2: the dense MLP (any leading shape). Qwen3-MoE: the sparse block, router then experts.

The HF modules do the math; this module only knows which of them a layer has and in which order they apply.
`tests/test_runner.py` and `tests/test_moe_runner.py` pin the result to the models' own `forward`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeGuard

import torch
from torch import nn
from transformers.models.qwen2 import modeling_qwen2
from transformers.models.qwen3_moe import modeling_qwen3_moe

Rotary = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

_ROTARY: dict[str, Rotary] = {
    "qwen2": modeling_qwen2.apply_rotary_pos_emb,
    "qwen3_moe": modeling_qwen3_moe.apply_rotary_pos_emb,
}


def rotary_of(model_type: str) -> Rotary:
    """The architecture's own `apply_rotary_pos_emb` (`runner_arch.py` admits no other model type)."""
    return _ROTARY[model_type]


def attention_inputs(
    attn: Any,
    h: torch.Tensor,
    head_dim: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rotary: Rotary,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's q, k, v of the packed batch `h` (normed), each [1, heads, num_tokens, head_dim]; q and
    k normalised per head where the attention (the layer's `self_attn`) has q_norm / k_norm (Qwen3), then
    rotated."""
    n = h.shape[0]
    q = attn.q_proj(h).view(n, -1, head_dim)
    k = attn.k_proj(h).view(n, -1, head_dim)
    v = attn.v_proj(h).view(n, -1, head_dim)
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    if q_norm is not None and k_norm is not None:
        q, k = q_norm(q), k_norm(k)  # over the last dim: per token and head
    q, k, v = (t.transpose(0, 1)[None] for t in (q, k, v))
    q, k = rotary(q, k, cos, sin)
    return q, k, v


def is_sparse(block: nn.Module) -> TypeGuard[modeling_qwen3_moe.Qwen3MoeSparseMoeBlock]:
    """Whether a layer's MLP is a sparse MoE block (what attention-FFN disaggregation sends away)."""
    return isinstance(block, modeling_qwen3_moe.Qwen3MoeSparseMoeBlock)


def mlp(block: nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One layer's MLP of the packed batch `h` [num_tokens, hidden] (normed), and the experts the router
    chose for each token ([num_tokens, top_k]) where the block is sparse, else None.

    Qwen3-MoE's block takes [batch, seq, hidden], flattens it to rows, routes them (`gate`: the top-k
    experts and their weights) and runs the experts on them (`experts`). The packed batch is rows already:
    the runner calls the two in that order itself, which is all the block's forward does, and keeps the
    router's choices."""
    if is_sparse(block):
        _, weights, chosen = block.gate(h)
        return block.experts(h, chosen, weights), chosen
    return block(h), None
