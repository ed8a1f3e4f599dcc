"""Per-operator step time (`target.time_model: operators`): a step as the kernels a GPU runs, one after
another, each with its own roofline, plus tensor-parallel all-reduces and the CPU's share.

Per GPU of a `tp`-way replica (weights, heads and vocabulary split `tp` ways; KV heads too, each GPU
holding at least one, so KV is replicated when tp > num_kv_heads), over a step of T new tokens::

    group              FLOPs                         bytes
    qkv_o              2·L·P_attn·T / tp             L·P_attn·2B / tp + activations [h, (q+kv)/tp, q/tp, h]
    mlp                2·L·P_mlp·T / tp              L·P_mlp·2B / tp + activations [h, 2i/tp, i/tp, h]
    prefill_attention  4·H·d·L·keys(chunks) / tp     KV of the chunks' context and new tokens
    decode_attention   4·H·d·L·keys(decodes) / tp    KV each decode reads (its context + itself)
    logits             2·V·h·num_logits / tp         W_head / tp + num_logits·V·4B / tp (fp32)
    ssm_proj           2·L_ssm·P_ssm·T / tp          L_ssm·P_ssm·2B / tp + activations      (hybrids only)
    ssm_scan           ModelProfile.ssm_work         each request's state read and written  (hybrids only)

    t_group = max(FLOPs / (peak·η_compute), bytes / (bw·η_bandwidth))     (η per group: config)

(per layer P_attn = h·(q + kv) + q·h and P_mlp = 3·h·i; h hidden, q = H·d query width, kv = 2·KVH·d,
i MLP width, L layers (a hybrid's attention layers), V vocabulary; P_ssm an SSM layer's projections).
Activations: the GEMMs' inputs and outputs, T x width x 2B each per layer, each read or written once,
through HBM only when larger than the GPU's L2 (a decode batch's stay on chip between kernels; a long
prompt chunk's do not). The LM head runs only when some
request needs logits. Unlike the aggregate roofline, the groups add: a decode's KV reads no longer
hide under a prompt chunk's GEMMs, as separate kernels do not overlap.

With tp > 1, two all-reduces per layer (after the attention output and the MLP down projection; one a
block in Nemotron-H: `ModelProfile.num_all_reduces`), each of T·h·2 bytes, ring algorithm over the TP
link::

    t_all_reduce = 2·L · (2(tp-1)/tp · T·h·2B / (link_bw·η_ar) + latency)

and the CPU's work on the step's path: `s_per_step + s_per_request·requests + s_per_token·T`.

Mixture-of-experts targets (`emulation.expert_parallel`): `mlp` covers the dense layers only; two more
groups, `shared_experts` (routers and shared experts, every token) and `routed_experts` (the busiest
EP rank's share: its tokens' FLOPs, its touched experts' weights), and the all-to-alls of the MoE
layers add. With data-parallel attention every other group runs over one rank's share of the step
(`step_shape.share_of`). MLA's attention FLOPs per key differ between prompt chunks and decodes, and
chunks up-project their cached context (`emulation.mla`); GEMMs of one-byte weights run at the FP8
peak. Dual-batch overlap runs the groups and all-to-alls as two half micro-batches (weights read by
each) and hides the smaller of compute and communication but one layer's::

    t = max(C, A) + min(C, A) / (2 · MoE layers)          overlap_s = C + A - t

Per GPU, the step's FLOPs are the groups' and its bytes their traffic: of it, the KV the T new tokens
write (`write_bytes_per_gpu`, vLLM's MFU estimate's write figure) and the rest read (weights, KV, and
spilled activations).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from emulation.config import CpuOverhead, OperatorEfficiencies
from emulation.expert_parallel import ExpertParallel, RoutedWork
from emulation.moe import ExpertLoad
from emulation.profiles import GpuProfile, ModelProfile
from emulation.quantization import GemmPeaks, gemm_peaks
from emulation.roofline import maximum, timed
from emulation.step_shape import StepItem, StepShape, share_of

LOGIT_BYTES = 4
"""Logits are written in float32."""


@dataclass(frozen=True)
class GroupTime:
    """One operator group's roofline on one GPU."""

    name: str
    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    measured_s: float = 0.0
    """Of `total_s`, what kernels measured on silicon priced (0: a roofline's; `emulation.measured`)."""

    @property
    def total_s(self) -> float:
        return maximum(self.compute_s, self.memory_s)

    def times(self, n: int) -> GroupTime:
        """The group run for `n` micro-batches of the same shape."""
        return dataclasses.replace(
            self, flops=n * self.flops, bytes=n * self.bytes, compute_s=n * self.compute_s,
            memory_s=n * self.memory_s, measured_s=n * self.measured_s,
        )  # fmt: skip


@dataclass(frozen=True)
class OperatorStepTime:
    """Itemised time of one step, in emulated seconds: the groups, the all-reduces, the CPU."""

    groups: tuple[GroupTime, ...]
    all_reduce_s: float
    cpu_s: float
    kv_write_bytes: float = 0.0
    """Of the groups' bytes, the KV the step's new tokens write (one GPU's)."""
    all_to_all_s: float = 0.0
    """The MoE layers' dispatches and combines (expert parallelism with data-parallel attention)."""
    overlap_s: float = 0.0
    """Of the groups' and all-to-alls' time, what dual-batch overlap hides."""
    expert_load: ExpertLoad | None = None
    """What the step asked of the experts (MoE targets)."""
    measured_s: float = 0.0
    """Of `gpu_s`, what kernels measured on silicon priced (`emulation.measured`; 0: all roofline)."""

    @property
    def gpu_s(self) -> float:
        return sum(g.total_s for g in self.groups) + self.all_reduce_s + self.all_to_all_s - self.overlap_s

    @property
    def total_s(self) -> float:
        return self.gpu_s + self.cpu_s

    @property
    def overhead_s(self) -> float:
        """The CPU's share (the aggregate model's `overhead_s`)."""
        return self.cpu_s

    def group(self, name: str) -> GroupTime:
        return next(g for g in self.groups if g.name == name)

    @property
    def flops_per_gpu(self) -> float:
        return sum((g.flops for g in self.groups), 0.0)

    @property
    def read_bytes_per_gpu(self) -> float:
        return sum((g.bytes for g in self.groups), 0.0) - self.kv_write_bytes

    @property
    def write_bytes_per_gpu(self) -> float:
        return self.kv_write_bytes


@dataclass(frozen=True)
class OperatorRoofline:
    """The per-operator time model of one engine replica: a target model on `tp` GPUs (for a MoE
    target, `tp` is the pool's attention_tp and `experts` lays out the rest)."""

    model: ModelProfile
    gpu: GpuProfile
    tp: int = 1
    eta: OperatorEfficiencies = field(default_factory=OperatorEfficiencies)
    cpu: CpuOverhead = field(default_factory=CpuOverhead)
    experts: ExpertParallel | None = None

    def step_time(self, items: Iterable[StepItem]) -> OperatorStepTime:
        return self.step_time_of(StepShape.of(items))

    def step_time_of(self, shape: StepShape) -> OperatorStepTime:
        """The time of a step of `shape` (no tokens: only the fixed CPU work)."""
        ex = self.experts
        ranks = ex.num_attention_ranks if ex else 1
        cpu_s = self.cpu_s(shape)
        if shape.num_new_tokens == 0:
            return OperatorStepTime((), 0.0, cpu_s)
        written = shape.num_new_tokens / ranks * self.model.kv_bytes_per_token_per_gpu(self.tp)
        all_reduce_s = self.all_reduce_s(shape.num_new_tokens / ranks)
        if ex is None or not ex.splits(shape):
            a2a_s = self.all_to_all_s(shape)
            load = ex.placement.load(shape.num_new_tokens) if ex else None
            return OperatorStepTime(self.groups(shape), all_reduce_s, cpu_s, written, a2a_s, 0.0, load)
        half = share_of(shape, 2)
        groups = tuple(g.times(2) for g in self.groups(half))
        all_reduce_s = 2 * self.all_reduce_s(half.num_new_tokens / ranks)  # each micro-batch's
        a2a_s = 2 * self.all_to_all_s(half)
        compute_s = sum(g.total_s for g in groups) + all_reduce_s
        longer = maximum(compute_s, a2a_s)
        shorter = compute_s + a2a_s - longer
        overlap_s = shorter - shorter / (2 * self.model.num_moe_layers)
        load = ex.placement.load(shape.num_new_tokens)
        return OperatorStepTime(groups, all_reduce_s, cpu_s, written, a2a_s, overlap_s, load)

    def all_to_all_s(self, shape: StepShape) -> float:
        """The MoE layers' dispatches and combines of a step of `shape` (all ranks' tokens; none without
        data-parallel attention)."""
        return self.experts.all_to_all_s(shape.num_new_tokens) if self.experts else 0.0

    def cpu_s(self, shape: StepShape) -> float:
        """The CPU's work on a step of `shape` (each DP attention rank's CPU works on its own share)."""
        ranks = self.experts.num_attention_ranks if self.experts else 1
        return (
            self.cpu.s_per_step
            + self.cpu.s_per_request * shape.num_requests / ranks
            + self.cpu.s_per_token * shape.num_new_tokens / ranks
        )

    def groups(self, shape: StepShape) -> tuple[GroupTime, ...]:
        """Every group's roofline on one GPU (a MoE target's: on its busiest EP rank)."""
        ex = self.experts
        rank = ex.busiest_rank(shape) if ex else shape
        common = self._dense_groups(rank) + self.ssm_groups(rank)
        if ex is None:
            return common
        return common + self.expert_groups(rank, ex.routed(shape.num_new_tokens))

    def _dense_groups(self, rank: StepShape) -> tuple[GroupTime, ...]:
        """The groups every model has, over one attention rank's share of the step."""
        m, tp, e = self.model, self.tp, self.eta
        t, dt, wb = rank.num_new_tokens, m.dtype_bytes, m.weight_bytes_per_layer_param
        h, i, attn_layers, mlp_layers = (
            m.hidden_size,
            m.intermediate_size,
            m.num_attention_layers,
            m.num_dense_mlp_layers,
        )
        q, kv = self._projection_widths()
        attn_params, mlp_params = m.attention_params, m.dense_mlp_params
        kv_per_token = m.kv_bytes_per_token_per_gpu(tp)
        vocab = m.vocab_size / tp
        attn_activations = self._spilled(t, h, (q + kv) / tp, q / tp, h)
        mlp_activations = self._spilled(t, h, 2 * i / tp, i / tp, h)
        context_tokens = rank.prefill_kv_tokens - rank.num_prefill_tokens
        num_chunks = rank.num_requests - rank.num_decodes
        prefill_keys = m.layer_mean_keys(rank.prefill_keys_attended, rank.num_prefill_tokens)
        prefill_flops = m.prefill_attention_flops_per_key / tp * prefill_keys
        prefill_flops += m.context_flops_per_token / tp * context_tokens  # MLA's up-projection
        prefill_kv_tokens = m.layer_mean_keys(context_tokens, num_chunks) + rank.num_prefill_tokens
        decode_keys = m.layer_mean_keys(rank.decode_keys_attended, rank.num_decodes)
        return (
            self._gemm("qkv_o", 2.0 * attn_layers * attn_params * t / tp,
                       attn_layers * (attn_params / tp * wb + attn_activations), self.peaks.layers),
            self._gemm("mlp", 2.0 * mlp_layers * mlp_params * t / tp,
                       mlp_layers * (mlp_params / tp * wb + mlp_activations), self.peaks.layers),
            self._group("prefill_attention", prefill_flops, kv_per_token * prefill_kv_tokens,
                        e.attention_compute, e.kv_bandwidth),
            self._group("decode_attention", m.decode_attention_flops_per_key / tp * decode_keys,
                        kv_per_token * decode_keys, e.attention_compute, e.kv_bandwidth),
            self._group("logits", 2.0 * vocab * h * rank.num_logits,
                        (vocab * h * dt + rank.num_logits * vocab * LOGIT_BYTES) if rank.num_logits else 0.0,
                        e.gemm_compute, e.weights_bandwidth),
        )  # fmt: skip

    def ssm_groups(self, rank: StepShape) -> tuple[GroupTime, ...]:
        """A hybrid model's SSM layers (none otherwise): `ssm_proj`, their projections (GEMMs), and
        `ssm_scan`, the scans and state traffic (`ModelProfile.ssm_work`), bound by memory and the
        attention kernels' efficiencies (chunked scans are batched matrix products over short chunks)."""
        m, tp, e = self.model, self.tp, self.eta
        if m.ssm is None:
            return ()
        t, layers, params = rank.num_new_tokens, m.num_ssm_layers, m.ssm_params
        inner = params // m.hidden_size  # in_proj's and out_proj's widths, together
        activations = self._spilled(t, m.hidden_size, inner / tp, m.hidden_size)
        num_chunks = rank.num_requests - rank.num_decodes
        flops, nbytes = m.ssm_work(rank.num_prefill_tokens, num_chunks, rank.num_decodes, tp)
        return (
            self._gemm("ssm_proj", 2.0 * layers * params * t / tp,
                       layers * (params / tp * m.weight_bytes_per_layer_param + activations),
                       self.peaks.layers),
            self._group("ssm_scan", flops, nbytes, e.attention_compute, e.kv_bandwidth),
        )  # fmt: skip

    def expert_groups(self, rank: StepShape, routed: RoutedWork) -> tuple[GroupTime, ...]:
        """A MoE target's routers and shared experts (over the rank's tokens) and routed experts (the
        busiest EP rank's)."""
        m, tp = self.model, self.tp
        shared = m.num_shared_params
        activations = m.num_moe_layers * self._spilled_bytes(routed.activation_bytes / m.num_moe_layers)
        return (
            self._gemm("shared_experts", 2.0 * shared * rank.num_new_tokens / tp,
                       shared / tp * m.weight_bytes_per_layer_param, self.peaks.layers),
            self._gemm("routed_experts", routed.flops, routed.weight_bytes + activations,
                       self.peaks.experts),
        )  # fmt: skip

    def _projection_widths(self) -> tuple[int, int]:
        """The query and key-value widths the attention projections write (MLA: the per-head query
        and the compressed latent with its rotary key)."""
        m = self.model
        if m.mla is not None:
            return m.num_heads * m.mla.qk_head_dim, m.mla.kv_values_per_token
        return m.num_heads * m.head_dim, 2 * m.num_kv_heads * m.head_dim

    def _spilled(self, num_tokens: float, *widths: float) -> float:
        """HBM bytes of activations `num_tokens` x each width: those larger than L2."""
        return sum(self._spilled_bytes(num_tokens * w * self.model.dtype_bytes) for w in widths)

    def _spilled_bytes(self, nbytes: float) -> float:
        """`nbytes` of one activation, if it does not fit in L2 (else it stays on chip: 0)."""
        return nbytes if nbytes > self.gpu.l2_cache_mb * 1e6 else 0.0

    def all_reduce_s(self, num_tokens: float) -> float:
        """Two ring all-reduces per layer of `num_tokens` x hidden (`num_all_reduces`; none without TP)."""
        if self.tp == 1:
            return 0.0
        m, tp = self.model, self.tp
        message = num_tokens * m.hidden_size * m.dtype_bytes
        wire_s = 2 * (tp - 1) / tp * message / (self.gpu.tp_link_gbs * 1e9 * self.eta.all_reduce_bandwidth)
        return m.num_all_reduces * (wire_s + self.gpu.all_reduce_latency_s)

    @cached_property
    def peaks(self) -> GemmPeaks:
        """The peaks this model's weight GEMMs run at on this GPU (emulation.quantization)."""
        return gemm_peaks(self.model, self.gpu)

    def _gemm(self, name: str, flops: float, nbytes: float, peak: float) -> GroupTime:
        """A group of weight GEMMs, at `peak` TFLOP/s (`peaks`: its weights' format's)."""
        return self._group(name, flops, nbytes, self.eta.gemm_compute, self.eta.weights_bandwidth, peak)

    def _group(
        self, name: str, flops: float, nbytes: float, eta_c: float, eta_b: float, peak: float | None = None
    ) -> GroupTime:
        """One GPU's roofline (its share already taken: tp 1 here) of `flops` and `nbytes` (at `peak`
        TFLOP/s if given)."""
        t = timed(flops, nbytes, self.gpu, 1, eta_c, eta_b, 0.0, peak_tflops=peak)
        return GroupTime(name, flops, nbytes, t.compute_s, t.memory_s)
