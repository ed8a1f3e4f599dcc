"""Attention-FFN disaggregation (AFD) of a mixture-of-experts pool: its replicas' attention and experts
on different GPUs, hidden states crossing between them at every MoE layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from emulation.config.strict import STRICT

DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp8": 1.0}
"""Bytes of one hidden value sent across the cut, by its dtype."""


@dataclass(frozen=True)
class AfdConfig:
    """One replica of the pool as `num_attention_ranks` attention ranks and `num_ffn_ranks` FFN ranks.

    The attention side is the pool's engine, as it is without AFD (scheduler, KV cache, sampling, the
    API path): its ranks are data-parallel, each the pool's `tp` GPUs of the pool's `gpu`, each holding
    its own requests and their KV, and every layer's attention and dense MLP. The FFN side holds the
    routers, shared and routed experts and nothing else (no requests, no scheduler, no KV): each FFN
    rank is `ffn_ep` x `ffn_tp` GPUs holding every expert (sharded ffn_ep ways, expert-parallel over
    target.ep_fabric inside the rank) and serves A/F consecutive attention ranks, the mapping vLLM's
    AFD plugin requires (A % F == 0): an FFN rank's batch is the sum of its attention ranks'.

    At every MoE layer each micro-batch's hidden states go attention -> FFN (A2F) and the experts'
    output comes back (F2A) over `link`; `num_micro_batches` micro-batches pipeline through the two
    sides (`emulation.afd`)."""

    __pydantic_config__ = STRICT

    num_attention_ranks: Annotated[int, Field(ge=1)] = 1
    """A: data-parallel attention ranks of one replica (its scheduler holds A ranks' worth of
    sequences, tokens and KV blocks, a request on one rank)."""
    num_ffn_ranks: Annotated[int, Field(ge=1)] = 1
    """F: FFN ranks of one replica; A must be a multiple of F (each serves A/F attention ranks)."""
    ffn_gpu: str | None = None
    """The FFN ranks' GPU, a name from emulation.profiles.GPUS (None: the pool's gpu); the sides can
    differ (MegaScale-Infer's heterogeneous layout: attention on bandwidth, experts on compute)."""
    ffn_ep: Annotated[int, Field(ge=1)] = 1
    """GPUs one FFN rank shards its experts over (expert-parallel inside the rank)."""
    ffn_tp: Annotated[int, Field(ge=1)] = 1
    """Tensor-parallel degree of each expert inside an FFN rank: an FFN rank is ffn_ep x ffn_tp GPUs."""
    link: str | None = None
    """The attention-FFN link, a name from emulation.profiles.LINKS (each GPU's NIC, per direction);
    its bandwidth and latency apply, not its per-transfer overhead (AFD's buffers are registered once,
    not per transfer). Required."""
    link_bandwidth: Annotated[float, Field(gt=0, le=1)] = 0.8
    """Share of the link's bandwidth a layer's transfer achieves (an assumption, as for all-to-alls:
    messages of a micro-batch are a few hundred KB to MB; measure yours)."""
    num_micro_batches: Annotated[int, Field(ge=1, le=8)] = 2
    """m: micro-batches each step is split into, pipelined through attention, the link and the experts
    (vLLM's plugin: 2, its dual-batch overlap; MegaScale-Infer 3 on fast links, 4 on slower ones)."""
    a2f_dtype: Literal["bf16", "fp8"] = "bf16"
    """Dtype of the hidden states sent to the experts (Step-3: fp8)."""
    f2a_dtype: Literal["bf16", "fp8"] = "bf16"
    """Dtype of the experts' output sent back (Step-3: bf16)."""
    dispatch: Literal["rank", "expert"] = "rank"
    """rank: a token's hidden state goes once to the FFN rank serving its attention rank, which
    dispatches it to its experts' GPUs inside (an all-to-all over target.ep_fabric when ffn_ep > 1),
    as Step-3 and vLLM's plugin do. expert: it goes straight to each GPU holding one of its experts
    (MegaScale-Infer's M2N: more bytes from the attention rank, about one copy per distinct GPU of its
    top-k experts, spread over the FFN GPUs' NICs; no all-to-all inside the FFN rank)."""
    send_routing: bool = False
    """The attention side routes and sends each token's expert choices with it (8 B a choice, as
    Step-3); false: the FFN side runs the routers."""
    barrier_jitter: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Spread of one attention rank's per-layer time from step to step (coefficient of variation). An
    FFN rank waits at every layer for all A/F attention ranks it serves: the expected slowest of them,
    mean x (1 + jitter x E[max of A/F standard normals]). 0: ranks in lockstep."""

    @property
    def ffn_gpus_per_rank(self) -> int:
        return self.ffn_ep * self.ffn_tp

    @property
    def a2f_bytes(self) -> float:
        return DTYPE_BYTES[self.a2f_dtype]

    @property
    def f2a_bytes(self) -> float:
        return DTYPE_BYTES[self.f2a_dtype]
