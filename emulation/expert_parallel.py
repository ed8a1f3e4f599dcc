"""One mixture-of-experts replica spread over GPUs: what a step's routed experts and all-to-alls cost
on its busiest GPU, for both time models.

A replica is `ep` expert-parallel ranks of `tp` GPUs (pools.*.ep, tp). Routed experts are sharded over
the ranks, each expert split tp ways inside its rank; everything else (attention, dense MLPs, shared
experts, routers, the LM head) is split over `attention_tp` GPUs: the rank's tp with data-parallel
attention (each rank then holds 1/ep of the step's requests), all ep x tp otherwise::

    per GPU of the busiest rank, over the step's T tokens (all ranks' together):
      routed FLOPs  = 2 · expert params · rank_tokens(T) · MoE layers / tp
      routed bytes  = expert bytes · rank_experts_touched(T) · MoE layers / tp
      all-to-all    = MoE layers · (dispatch + combine)(T / ep)          (DP attention only: without
                      it every rank already holds every token, and the TP all-reduce combines)

rank_tokens and rank_experts_touched are emulation.moe's expectations under the routing skew.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulation.all_to_all import AllToAll
from emulation.config import AfdConfig, EpFabricConfig, MoeRoutingConfig, PoolConfig
from emulation.model_profile import ModelProfile
from emulation.moe import ExpertLoad, ExpertPlacement, MoeGeometry, expert_popularity
from emulation.profiles import GpuProfile
from emulation.step_shape import StepShape, busiest_rank

DBO_DECODE_TOKEN_THRESHOLD = 32
"""vLLM's `dbo_decode_token_threshold`: a decode-only step splits into two micro-batches from this many
tokens a rank."""
DBO_PREFILL_TOKEN_THRESHOLD = 512
"""vLLM's `dbo_prefill_token_threshold`: a step with prompt chunks splits from this many tokens a rank."""


@dataclass(frozen=True)
class RoutedWork:
    """The busiest rank's routed experts in one step, on one of its GPUs, over all MoE layers."""

    flops: float
    weight_bytes: float
    activation_bytes: float
    """Each assignment's input, gate/up output, activation and output, T x width x dtype each."""
    load: ExpertLoad


class ExpertParallel:
    """A MoE target's replica as its pool lays it out (see the module's docstring)."""

    def __init__(
        self,
        model: ModelProfile,
        gpu: GpuProfile,
        pool: PoolConfig,
        routing: MoeRoutingConfig | None = None,
        fabric: EpFabricConfig | None = None,
    ) -> None:
        routing, fabric = routing or MoeRoutingConfig(), fabric or EpFabricConfig()
        assert model.moe is not None, f"{model.name} has no experts"
        self.model, self.moe = model, model.moe
        self.ep, self.tp, self.enable_dbo = pool.ep, pool.tp, pool.enable_dbo
        self.num_attention_ranks, self.attention_tp = pool.num_attention_ranks, pool.attention_tp
        popularity = expert_popularity(
            routing.skew, self.moe.num_experts, routing.zipf_s, routing.loads_file, routing.seed
        )
        self.placement = ExpertPlacement(
            popularity, self.moe.num_experts_per_tok, pool.ep, pool.num_redundant_experts
        )
        self.all_to_all = (
            all_to_all_of(model.hidden_size, self.moe, gpu, pool, fabric) if pool.dp_attention else None
        )

    def busiest_rank(self, shape: StepShape) -> StepShape:
        """The busiest data-parallel attention rank's share of `shape` (`step_shape.busiest_rank`)."""
        return busiest_rank(shape, self.num_attention_ranks)

    def splits(self, shape: StepShape) -> bool:
        """Dual-batch overlap runs this step as two micro-batches: enabled, and each rank has vLLM's
        threshold of tokens (fewer are not worth a split)."""
        if not self.enable_dbo:
            return False
        threshold = DBO_PREFILL_TOKEN_THRESHOLD if shape.num_prefill_tokens else DBO_DECODE_TOKEN_THRESHOLD
        return bool(shape.num_new_tokens / self.num_attention_ranks >= threshold)

    def routed(self, num_tokens: int) -> RoutedWork:
        """The busiest rank's routed work, per GPU, for a step of `num_tokens` tokens (all ranks')."""
        load = self.placement.load(num_tokens)
        m, layers, tp = self.model, self.model.num_moe_layers, self.tp
        params = self.moe.expert_params(m.hidden_size)
        width = 2 * m.hidden_size + 3 * self.moe.moe_intermediate_size / tp
        return RoutedWork(
            flops=2.0 * params * load.rank_tokens * layers / tp,
            weight_bytes=params * m.expert_weight_bytes * load.rank_experts_touched * layers / tp,
            activation_bytes=load.rank_tokens * width * m.dtype_bytes * layers,
            load=load,
        )

    def all_to_all_s(self, num_tokens: float) -> float:
        """Every MoE layer's dispatch and combine in a step of `num_tokens` tokens (all ranks')."""
        if self.all_to_all is None:
            return 0.0
        return self.model.num_moe_layers * self.all_to_all.layer_s(num_tokens / self.ep)


def all_to_all_of(
    hidden_size: int, moe: MoeGeometry, gpu: GpuProfile, pool: PoolConfig, fabric: EpFabricConfig
) -> AllToAll:
    """The all-to-all of `pool`'s replicas over `fabric` (its unset figures: the GPU's)."""
    return AllToAll(
        ep=pool.ep,
        tp=pool.tp,
        hidden_size=hidden_size,
        num_experts=moe.num_experts,
        top_k=moe.num_experts_per_tok,
        gpus_per_node=fabric.gpus_per_node or gpu.gpus_per_node,
        scale_up_bytes_per_s=(fabric.scale_up_gbs or gpu.tp_link_gbs) * 1e9,
        scale_out_bytes_per_s=(fabric.scale_out_gbs or gpu.scale_out_gbs) * 1e9,
        scale_up_latency_s=fabric.scale_up_latency_s,
        scale_out_latency_s=fabric.scale_out_latency_s,
        eta=fabric.all_to_all_bandwidth,
        dispatch_bytes=fabric.dispatch_bytes,
        combine_bytes=fabric.combine_bytes,
    )


def weight_bytes_per_gpu(model: ModelProfile, pool: PoolConfig) -> float:
    """What one GPU of a replica of `pool` holds: its share of the dense weights (attention_tp ways)
    and of its rank's routed experts (their copies included: every rank has the same slots). With
    AFD, an attention GPU's: the dense weights less the routers and shared experts, which the FFN
    ranks hold (`ffn_weight_bytes_per_gpu`)."""
    dense = (model.weight_bytes - model.routed_weight_bytes) / pool.attention_tp
    if pool.afd is not None:
        return dense - model.num_shared_params * model.weight_bytes_per_layer_param / pool.attention_tp
    if model.moe is None:
        return dense
    num_experts = model.moe.num_experts
    slots = -(-(num_experts + pool.num_redundant_experts) // pool.ep)
    return dense + model.routed_weight_bytes / num_experts * slots / pool.tp


def ffn_weight_bytes_per_gpu(model: ModelProfile, afd: AfdConfig) -> float:
    """What one GPU of an AFD FFN rank holds: its share (ffn_ep x ffn_tp ways) of the routed experts, and
    every shared expert and router split ffn_tp ways (each GPU runs them for its own tokens)."""
    shared = model.num_shared_params * model.weight_bytes_per_layer_param
    return model.routed_weight_bytes / afd.ffn_gpus_per_rank + shared / afd.ffn_tp
