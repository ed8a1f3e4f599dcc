"""Attention-FFN disaggregation (AFD): what crosses between a replica's attention side (the engine's
runner) and one of its FFN ranks at a MoE layer, once per layer per step (never per token).

    attention ──FfnBatch (A2F: normed hidden states of its rows)──► FFN rank: router + experts
    attention ◄──FfnOutput (F2A: the experts' output, the router's choices)── FFN rank

The tensors are the point: they are the real hidden states of the runner model, so a wrong row, layer or
expert shows up as wrong tokens. Numpy crosses Ray's object store without pickling its buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class FfnBatch:
    """attention -> FFN rank (A2F): one layer's rows of the attention ranks the FFN rank serves."""

    layer: int
    """The decoder layer whose MoE block applies: an FFN rank holds every MoE layer's block, and the
    attention side walks the layers, so each crossing says where it is."""
    hidden_states: np.ndarray = field(repr=False)
    """[num_tokens, hidden] float32: `post_attention_layernorm` of the residual stream, the rows of this
    rank's attention ranks packed in the step's order (the attention side keeps the residual and adds
    the output back itself: only the MoE block's input needs to cross)."""


@dataclass(frozen=True)
class FfnOutput:
    """FFN rank -> attention (F2A): the MoE block's answer for an `FfnBatch`, rows in the order sent."""

    hidden_states: np.ndarray = field(repr=False)
    """[num_tokens, hidden] float32: the sparse MoE block's output (router-weighted sum of the chosen
    experts), which the attention side adds to the residual."""
    chosen_experts: np.ndarray = field(repr=False)
    """[num_tokens, top_k] int64: the experts the router chose for each row. Only the FFN side routes
    (`afd.send_routing=false`'s layout), so the engine learns its expert load (the runner's
    `last_expert_counts`, the MoE metrics) from this."""
