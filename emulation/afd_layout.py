"""The step-time model of a pool under attention-FFN disaggregation (`pools.*.afd`): one replica's step
as its busiest attention rank runs it, the MoE layers pipelined with the FFN ranks (`emulation.afd`).

The engine schedules all A attention ranks' requests as one step; each rank runs its share (an even
share, or the step's largest request if more: a request's tokens run on one rank). Of a rank's step,
split into m micro-batches (afd.num_micro_batches, or one a request on a rank with fewer)::

    T_a   one micro-batch's attention at one layer: qkv_o and attention over all layers / L, and its
          output's all-reduce across the rank's tp GPUs (none at tp 1), times
          (1 + barrier_jitter x E[max of A/F standard normals]): the FFN rank waits for the slowest of
          the attention ranks it serves at every layer
    T_e   one micro-batch's experts at one MoE layer on the FFN rank serving it: routers and shared
          experts (on every GPU of the rank) over the tokens of its A/F attention ranks (the sum of
          their micro-batches), routed experts on its busiest GPU (ffn_ep of them, expert-parallel,
          with their all-to-all), and with ffn_tp > 1 the all-reduce of each expert's output
    T_c   each way: bytes / (NICs x bandwidth x link_bandwidth), the slower of the two ends (and the
          link's latency, twice in each round trip, never in a stage: `afd.pipeline`):
          an attention rank sends its micro-batch over its tp NICs, an FFN rank takes A/F of them
          over its ffn_ep x ffn_tp NICs. dispatch: rank sends a token once (to the FFN rank, whose
          all-to-all is then part of T_e); dispatch: expert a copy to each distinct GPU holding one
          of its experts, the busiest FFN GPU taking its experts' share
    step  pipeline(T_a, T_e, T_c, latency) over the MoE layers + what runs outside it on the attention side
          (the dense layers with their attention and both all-reduces, the LM head, once a
          micro-batch; the CPU once a step)

Smaller micro-batches cost the experts: each reads the weights of every expert its tokens touch, so
its GEMMs fall further under the roofline's ridge as m grows.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from functools import cached_property
from statistics import NormalDist

import numpy as np

from emulation.afd import PipelineTime, cut_bytes_per_layer, pipeline
from emulation.all_to_all import distinct_holders_per_token
from emulation.config import (
    AfdConfig,
    CpuOverhead,
    EpFabricConfig,
    MoeRoutingConfig,
    OperatorEfficiencies,
    PoolConfig,
)
from emulation.expert_parallel import ExpertParallel
from emulation.model_profile import ModelProfile
from emulation.moe import ExpertLoad
from emulation.operators import GroupTime, OperatorRoofline
from emulation.profiles import GpuProfile, LinkProfile
from emulation.step_shape import StepShape, busiest_rank, share_of


@functools.lru_cache(maxsize=64)
def expected_max_of_normals(n: int) -> float:
    """E[max of n standard normals] = integral of x · n · phi(x) · Phi(x)^(n-1) dx, by the trapezoid rule
    over [-8, 8] (0 for one; 1.0294 for four)."""
    if n <= 1:
        return 0.0
    x = np.linspace(-8.0, 8.0, 4001)
    normal = NormalDist()
    cdf = np.array([normal.cdf(v) for v in x])
    density = np.exp(-(x**2) / 2) / math.sqrt(2 * math.pi)
    return float(np.trapezoid(x * n * density * cdf ** (n - 1), x))


@dataclass(frozen=True)
class AfdStepTime:
    """One replica's step under AFD, as its busiest attention rank runs it, itemised (seconds, bytes)."""

    pipeline: PipelineTime
    """The MoE layers' micro-batches through attention, the link and the experts."""
    outside_s: float
    """What runs outside the pipeline on the attention side: dense-MLP layers (their attention and
    all-reduces), the LM head, the CPU's work."""
    cpu_s: float
    """Of `outside_s`, the CPU's."""
    attention_layer_s: float
    """T_a: one micro-batch's attention at one layer (the barrier's expected wait included)."""
    ffn_layer_s: float
    """T_e: one micro-batch's experts at one MoE layer, on the FFN rank serving the busiest rank."""
    a2f_s: float
    f2a_s: float
    """One micro-batch's transfer each way at one layer."""
    a2f_bytes: float
    f2a_bytes: float
    """What the replica's attention ranks send to the experts and get back in the step, all layers and
    micro-batches."""
    num_tokens: float
    """The replica's step's tokens, all attention ranks' together."""
    num_micro_batches: int = 1
    """The micro-batches the step ran (afd.num_micro_batches, or fewer on a rank with fewer requests)."""
    attention_groups: tuple[GroupTime, ...] = ()
    """The attention side's operator groups over the step (its micro-batches together), one GPU's."""
    kv_write_bytes: float = 0.0
    expert_load: ExpertLoad | None = None
    """What one micro-batch asks of an FFN rank's experts (the tokens of the A/F ranks it serves; its
    `num_tokens` that micro-batch's, not the step's)."""

    @property
    def total_s(self) -> float:
        return self.pipeline.total_s + self.outside_s

    @property
    def overhead_s(self) -> float:
        return self.cpu_s

    @property
    def flops_per_gpu(self) -> float:
        """An attention GPU's (the engine's own GPUs; the FFN ranks' are not the engine's)."""
        return sum((g.flops for g in self.attention_groups), 0.0)

    @property
    def read_bytes_per_gpu(self) -> float:
        return sum((g.bytes for g in self.attention_groups), 0.0) - self.kv_write_bytes

    @property
    def write_bytes_per_gpu(self) -> float:
        return self.kv_write_bytes

    @property
    def all_to_all_s(self) -> float:
        """0: the FFN rank's own all-to-alls are inside T_e, and the cut's transfers are `a2f_s`/`f2a_s`."""
        return 0.0

    @property
    def overlap_s(self) -> float:
        """0: no dual-batch overlap; what the pipeline hides is in `pipeline`."""
        return 0.0

    @property
    def measured_s(self) -> float:
        """0: AFD's pipeline is priced by its rooflines."""
        return 0.0


@dataclass(frozen=True)
class AfdLayout:
    """The time model of one replica of an AFD pool (the module docstring): `afd` says its ranks,
    micro-batches and dtypes; `link` its NICs."""

    model: ModelProfile
    attention_gpu: GpuProfile
    ffn_gpu: GpuProfile
    afd: AfdConfig
    link: LinkProfile
    attention_tp: int = 1
    eta: OperatorEfficiencies = field(default_factory=OperatorEfficiencies)
    cpu: CpuOverhead = field(default_factory=CpuOverhead)
    routing: MoeRoutingConfig = field(default_factory=MoeRoutingConfig)
    fabric: EpFabricConfig = field(default_factory=EpFabricConfig)

    def step_time_of(self, shape: StepShape) -> AfdStepTime:
        """The step of the replica's batch `shape` (all its attention ranks' requests)."""
        afd, model, attention = self.afd, self.model, self._attention
        a, f = afd.num_attention_ranks, afd.num_ffn_ranks
        rank = busiest_rank(shape, a)
        cpu_s = attention.cpu_s(rank)
        if shape.num_new_tokens == 0:
            return AfdStepTime(pipeline(0.0, 0.0, 0.0, 1, 1), cpu_s, cpu_s, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        # A rank with fewer requests than micro-batches runs one a request: a request is not split.
        m = max(1, min(afd.num_micro_batches, math.floor(rank.num_requests + 1e-9)))
        micro = share_of(rank, m)
        groups = attention.groups(micro)
        side = {g.name: g.total_s for g in groups}
        # One tensor-parallel all-reduce a layer's attention output (before it crosses), one more a
        # dense layer's MLP: a MoE layer's MLP output comes back whole from the FFN rank.
        all_reduce_s = attention.all_reduce_s(micro.num_new_tokens) / model.num_all_reduces
        t_a = (side["qkv_o"] + side["prefill_attention"] + side["decode_attention"]) / model.num_layers
        t_a += all_reduce_s
        dense_layers = model.num_layers - model.num_moe_layers
        outside = m * (side["mlp"] + side["logits"] + dense_layers * (t_a + all_reduce_s))
        busy_s = t_a  # the barrier's wait below is the rank's idle time, not its work
        t_a *= 1 + afd.barrier_jitter * expected_max_of_normals(a // f)
        # An FFN rank's micro-batch: the busiest attention rank's and those of the A/F - 1 others it
        # serves, the rest of the step spread evenly over the other A - 1 ranks.
        busiest = rank.num_new_tokens / shape.num_new_tokens
        served = busiest + (a // f - 1) * (1 - busiest) / (a - 1) if a > 1 else 1.0
        ffn_micro = share_of(shape, m / served)
        t_e, load = self._ffn_layer(ffn_micro)
        a2f_s, f2a_s = (self._wire_s(micro, ffn_micro, nbytes, routed, load) for nbytes, routed in self._ways)
        latency_s = self.link.latency_s
        piped = pipeline(t_a, t_e, a2f_s, m, model.num_moe_layers, f2a_s=f2a_s, latency_s=latency_s)
        busy_s *= m * model.num_moe_layers
        piped = dataclasses.replace(piped, attention_s=busy_s, attention_bubble_s=piped.total_s - busy_s)
        a2f_bytes, f2a_bytes = (
            self._bytes(shape.num_new_tokens, nbytes, routed) * model.num_moe_layers
            for nbytes, routed in self._ways
        )
        kv_write = rank.num_new_tokens * model.kv_bytes_per_token_per_gpu(self.attention_tp)
        return AfdStepTime(
            piped, outside + cpu_s, cpu_s, t_a, t_e, latency_s + a2f_s, latency_s + f2a_s, a2f_bytes,
            f2a_bytes, shape.num_new_tokens, m, tuple(g.times(m) for g in groups), kv_write, load,
        )  # fmt: skip

    @property
    def _ways(self) -> tuple[tuple[float, bool], tuple[float, bool]]:
        """(bytes a hidden value, with the expert choices) of A2F, then F2A."""
        return (self.afd.a2f_bytes, self.afd.send_routing), (self.afd.f2a_bytes, False)

    @cached_property
    def _attention(self) -> OperatorRoofline:
        """The attention side's per-operator model: one rank of attention_tp GPUs, no experts (built
        once: the step reads it every time)."""
        return OperatorRoofline(self.model, self.attention_gpu, self.attention_tp, self.eta, self.cpu)

    @cached_property
    def _ffn(self) -> OperatorRoofline:
        """An FFN rank's: every expert over its ffn_ep GPUs; dispatched inside the rank (an all-to-all
        over target.ep_fabric) unless the attention ranks dispatch to the experts' GPUs themselves."""
        afd = self.afd
        inside = afd.dispatch == "rank" and afd.ffn_ep > 1
        rank = PoolConfig(replicas=1, ep=afd.ffn_ep, tp=afd.ffn_tp, dp_attention=inside)
        experts = ExpertParallel(self.model, self.ffn_gpu, rank, self.routing, self.fabric)
        return OperatorRoofline(self.model, self.ffn_gpu, afd.ffn_tp, self.eta, self.cpu, experts)

    @cached_property
    def _copies_per_token(self) -> float:
        """Copies of a token's hidden state one way: 1, or (dispatch: expert) the distinct FFN GPUs
        its top-k experts are on (`all_to_all.distinct_holders_per_token`, uniform routing)."""
        moe = self.model.moe
        assert moe is not None
        if self.afd.dispatch == "rank":
            return 1.0
        return distinct_holders_per_token(moe.num_experts, moe.num_experts_per_tok, self.afd.ffn_ep)

    def _ffn_layer(self, ffn_micro: StepShape) -> tuple[float, ExpertLoad]:
        """T_e and the expert load of one FFN-rank micro-batch `ffn_micro`."""
        ffn = self._ffn
        assert ffn.experts is not None
        tokens, model = ffn_micro.num_new_tokens, self.model
        routed = ffn.experts.routed(math.ceil(tokens - 1e-9))  # whole tokens: a fraction still routes
        groups = ffn.expert_groups(share_of(ffn_micro, self.afd.ffn_ep), routed)
        total = sum(g.total_s for g in groups) + ffn.experts.all_to_all_s(tokens)
        # each expert split ffn_tp ways: its output all-reduced across them, once a layer
        all_reduce_s = ffn.all_reduce_s(tokens / self.afd.ffn_ep) / model.num_all_reduces
        return total / model.num_moe_layers + all_reduce_s, routed.load

    def _bytes(self, num_tokens: float, nbytes: float, routed: bool) -> float:
        """One layer's bytes for `num_tokens` tokens one way, every copy of each."""
        return num_tokens * self._copies_per_token * cut_bytes_per_layer(self.model, nbytes, routed)

    def _wire_s(
        self, micro: StepShape, ffn_micro: StepShape, nbytes: float, routed: bool, load: ExpertLoad
    ) -> float:
        """One micro-batch's wire time one way at one layer (the link's latency apart): the slower
        end's NICs. An FFN rank takes its A/F attention ranks' micro-batches over its GPUs' NICs: evenly
        (dispatch: rank), or each GPU its experts' share, the busiest GPU's the load's imbalance over the
        mean (dispatch: expert)."""
        nic = self.link.bytes_per_s * self.afd.link_bandwidth
        sent = self._bytes(micro.num_new_tokens, nbytes, routed) / (self.attention_tp * nic)
        taken = self._bytes(ffn_micro.num_new_tokens, nbytes, routed) / (self.afd.ffn_gpus_per_rank * nic)
        if self.afd.dispatch == "expert":
            taken *= load.imbalance
        return max(sent, taken)
