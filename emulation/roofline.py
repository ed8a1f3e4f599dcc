"""Aggregate roofline step time of the emulated target (`target.time_model: aggregate`): a pure
function of the batch.

One engine step runs the scheduled tokens of several requests in one forward pass, taken as one
roofline over the whole batch::

    flops = 2·P_layers·new_tokens + attention(new_tokens, context) + 2·P_head·num_logits + SSM scans
    bytes = step weights + KV read (context tokens of every scheduled request) + SSM state traffic
    t     = max(flops / (peak·η_c), bytes / (bw·η_b)) + overhead

The KV the new tokens write (new_tokens · KV bytes per token) is not priced; it is the step's
`write_bytes`, beside `flops` and `bytes` (read) the figures vLLM's MFU estimate exports per GPU.

Attention over `keys attended` (`emulation.step_shape`), 2 FLOPs per MAC for QK^T and again for PV::

    flops = 4 · num_heads · head_dim · attention layers · keys attended

A hybrid model's SSM layers hold no KV; their scans and state reads and writes are
`ModelProfile.ssm_work`'s, the same figures the per-operator model's `ssm_scan` group prices.

Tensor parallelism multiplies peak compute and bandwidth by `tp`; its all-reduces are not modelled
(the per-operator model, `emulation.operators`, has them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from emulation.config import PoolConfig, TestbedConfig
from emulation.expert_parallel import ExpertParallel
from emulation.moe import ExpertLoad
from emulation.profiles import GPUS, GpuProfile, ModelProfile
from emulation.quantization import GemmPeaks, gemm_peaks
from emulation.step_shape import StepItem, StepShape, share_of


def maximum(a: float, b: float) -> float:
    """`max`, elementwise when given a window of steps' arrays (`step_shape.decode_steps`); the same
    IEEE operations either way, so a window's step times equal its steps' one at a time, bit for bit."""
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


@dataclass(frozen=True)
class StepTime:
    """Itemised roofline time of one step, in emulated seconds."""

    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    overhead_s: float
    tp: int = 1
    """GPUs the step runs on (`flops` and `bytes` are their sum)."""
    write_bytes: float = 0.0
    """KV the step's new tokens write, over its GPUs (not priced: `bytes` are the reads)."""
    all_to_all_s: float = 0.0
    """MoE targets with data-parallel attention: the MoE layers' dispatches and combines."""
    overlap_s: float = 0.0
    """Of the roofline's and the all-to-alls' time, what dual-batch overlap hides."""
    expert_load: ExpertLoad | None = None
    """What the step asked of the experts (MoE targets)."""

    @property
    def total_s(self) -> float:
        return maximum(self.compute_s, self.memory_s) + self.overhead_s + self.all_to_all_s - self.overlap_s

    @property
    def measured_s(self) -> float:
        """0: a roofline measures nothing."""
        return 0.0

    @property
    def flops_per_gpu(self) -> float:
        return self.flops / self.tp

    @property
    def read_bytes_per_gpu(self) -> float:
        return self.bytes / self.tp

    @property
    def write_bytes_per_gpu(self) -> float:
        return self.write_bytes / self.tp

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def timed(
    flops: float,
    nbytes: float,
    gpu: GpuProfile,
    tp: int,
    eta_compute: float,
    eta_bandwidth: float,
    overhead_s: float,
    write_bytes: float = 0.0,
    peak_tflops: float | None = None,
) -> StepTime:
    """The roofline of `flops` and `nbytes` (read) on `tp` GPUs at the fitted efficiencies (compute
    at `peak_tflops` if given, else the GPU's BF16 peak); `write_bytes` is carried along, not priced."""
    compute_s = flops / ((peak_tflops or gpu.peak_tflops) * 1e12 * tp * eta_compute)
    memory_s = nbytes / (gpu.memory_bw_gbs * 1e9 * tp * eta_bandwidth)
    return StepTime(flops, nbytes, compute_s, memory_s, overhead_s, tp, write_bytes)


@dataclass(frozen=True)
class Roofline:
    """The time model of one engine replica: a target model on `tp` GPUs with fitted efficiencies
    (a MoE target: on all its pool's ep x tp GPUs, laid out by `experts`)."""

    model: ModelProfile
    gpu: GpuProfile
    tp: int = 1
    eta_compute: float = 1.0
    eta_bandwidth: float = 1.0
    overhead_s: float = 0.0
    experts: ExpertParallel | None = None

    def step_time(self, items: Iterable[StepItem]) -> StepTime:
        return self.step_time_of(StepShape.of(items))

    @cached_property
    def peaks(self) -> GemmPeaks:
        """The peaks this model's weight GEMMs run at on this GPU (emulation.quantization)."""
        return gemm_peaks(self.model, self.gpu)

    def step_time_of(self, shape: StepShape) -> StepTime:
        """The time of a step of `shape` (the engine's entry: the scheduler builds the shape)."""
        m = self.model
        if shape.num_new_tokens == 0:
            return StepTime(0.0, 0.0, 0.0, 0.0, self.overhead_s, self.tp)
        if self.experts is not None:
            return self._moe_step_time(shape, self.experts)
        keys = m.layer_mean_keys(shape.keys_attended, shape.num_new_tokens)  # (sliding windows)
        context = m.layer_mean_keys(shape.num_context_tokens, shape.num_requests)
        num_chunks = shape.num_requests - shape.num_decodes
        ssm_flops, ssm_bytes = m.ssm_work(shape.num_prefill_tokens, num_chunks, shape.num_decodes)
        attention_flops = m.prefill_attention_flops_per_key * keys
        head_flops = 2.0 * m.num_head_params * shape.num_logits
        layer_flops = 2.0 * m.num_layer_params * shape.num_new_tokens
        flops = layer_flops + attention_flops + head_flops + ssm_flops
        # the layers' GEMMs at their format's peak, counted in BF16-peak FLOPs (x 1.0 for BF16 weights,
        # so a BF16 target's sum is the same IEEE operations as before formats existed)
        at_bf16_peak = layer_flops * self.gpu.peak_tflops / self.peaks.layers
        timed_flops = at_bf16_peak + attention_flops + head_flops + ssm_flops
        nbytes = 1.0 * (m.step_weight_bytes + context * m.kv_bytes_per_token + ssm_bytes)  # float(s)
        # as the operator model counts it: KV heads replicated where tp exceeds them
        written = 1.0 * shape.num_new_tokens * m.kv_bytes_per_token_per_gpu(self.tp) * self.tp
        t, e_c, e_b = self.tp, self.eta_compute, self.eta_bandwidth
        step = timed(timed_flops, nbytes, self.gpu, t, e_c, e_b, self.overhead_s, written)
        return dataclasses.replace(step, flops=flops)

    def _moe_step_time(self, shape: StepShape, ex: ExpertParallel) -> StepTime:
        """A MoE target's step: one roofline over the replica's GPUs as if each were the busiest EP
        rank's (and, with data-parallel attention, the busiest rank's), plus the all-to-alls; split by
        dual-batch overlap, two half steps whose communication hides under their compute
        (emulation.operators says how)."""
        parts = 2 if ex.splits(shape) else 1
        gemm, at_peak, bf16, nbytes = (parts * x for x in self._moe_work(share_of(shape, parts), ex))
        m, g, e_c, e_b = self.model, self.tp, self.eta_compute, self.eta_bandwidth
        gemm_t = timed(at_peak, nbytes, self.gpu, g, e_c, e_b, self.overhead_s, peak_tflops=self.peaks.layers)
        compute_s = gemm_t.compute_s + timed(bf16, 0.0, self.gpu, g, e_c, e_b, 0.0).compute_s
        a2a_s = parts * ex.all_to_all_s(shape.num_new_tokens / parts)
        overlap_s = 0.0
        if parts == 2:
            gpu_s = maximum(compute_s, gemm_t.memory_s)
            shorter = gpu_s + a2a_s - maximum(gpu_s, a2a_s)
            overlap_s = shorter - shorter / (2 * m.num_moe_layers)
        rank_tokens = shape.num_new_tokens / ex.num_attention_ranks  # each of a rank's GPUs writes its share
        written = rank_tokens * m.kv_bytes_per_token_per_gpu(ex.attention_tp) * g
        load = ex.placement.load(shape.num_new_tokens)
        return StepTime(gemm + bf16, nbytes, compute_s, gemm_t.memory_s, self.overhead_s, g, written,
                        a2a_s, overlap_s, load)  # fmt: skip

    def _moe_work(self, shape: StepShape, ex: ExpertParallel) -> tuple[float, float, float, float]:
        """The layers' GEMM FLOPs, the same counted at the layer weights' peak (the routed experts'
        scaled by their own format's peak: x 1.0 when the two are alike), the BF16 FLOPs (attention, LM
        head) and the bytes read of a step of `shape`, over all the replica's GPUs: each data-parallel
        attention rank as busy as the busiest (reading the dense weights and its requests' KV), each
        GPU its busiest EP rank's routed share."""
        m, g, ranks = self.model, self.tp, ex.num_attention_ranks
        rank = ex.busiest_rank(shape)
        routed = ex.routed(shape.num_new_tokens)
        dense = 2.0 * m.num_dense_params * rank.num_new_tokens * ranks
        gemm = dense + routed.flops * g
        expert_scale = self.peaks.layers / self.peaks.experts
        at_peak = dense + routed.flops * g * expert_scale
        bf16 = ranks * (
            m.prefill_attention_flops_per_key
            * m.layer_mean_keys(rank.prefill_keys_attended, rank.num_prefill_tokens)
            + m.decode_attention_flops_per_key
            * m.layer_mean_keys(rank.decode_keys_attended, rank.num_decodes)
            + m.context_flops_per_token * (rank.prefill_kv_tokens - rank.num_prefill_tokens)
            + 2.0 * m.num_head_params * rank.num_logits
        )
        chunks = rank.num_requests - rank.num_decodes
        ssm_flops, ssm_bytes = m.ssm_work(rank.num_prefill_tokens, chunks, rank.num_decodes)  # (hybrids)
        bf16 += ranks * ssm_flops
        context = m.layer_mean_keys(rank.num_context_tokens, rank.num_requests)  # (sliding windows)
        kv = ranks * context * m.kv_bytes_per_token_per_gpu(ex.attention_tp) * ex.attention_tp
        nbytes = m.step_weight_bytes * ranks + routed.weight_bytes * g + kv + ranks * ssm_bytes
        return gemm, at_peak, bf16, nbytes


def roofline_for(cfg: TestbedConfig, pool: PoolConfig) -> Roofline:
    """The fitted time model of one replica of `pool` under `cfg`'s target."""
    t = cfg.target
    return Roofline(
        t.profile,
        GPUS[pool.gpu],
        tp=pool.num_gpus,
        eta_compute=t.eta_compute,
        eta_bandwidth=t.eta_bandwidth,
        overhead_s=t.step_overhead_s,
        experts=experts_for(cfg, pool),
    )


def experts_for(cfg: TestbedConfig, pool: PoolConfig) -> ExpertParallel | None:
    """How a replica of `pool` lays out `cfg`'s target's experts (None for a dense target)."""
    t = cfg.target
    model = t.profile
    if model.moe is None:
        return None
    return ExpertParallel(model, GPUS[pool.gpu], pool, t.moe_routing, t.ep_fabric)
