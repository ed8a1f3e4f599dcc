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

    t_group = max(FLOPs / (peak·η_compute), bytes / (bw·η_bandwidth))     (η per group: config)

(per layer P_attn = h·(q + kv) + q·h and P_mlp = 3·h·i; h hidden, q = H·d query width, kv = 2·KVH·d,
i MLP width, L layers, V vocabulary). Activations: the GEMMs' inputs and outputs, T x width x 2B each
per layer, each read or written once, through HBM only when larger than the GPU's L2 (a decode
batch's stay on chip between kernels; a long prompt chunk's do not). The LM head runs only when some
request needs logits. Unlike the aggregate roofline, the groups add: a decode's KV reads no longer
hide under a prompt chunk's GEMMs, as separate kernels do not overlap.

With tp > 1, two all-reduces per layer (after the attention output and the MLP down projection), each
of T·h·2 bytes, ring algorithm over the TP link::

    t_all_reduce = 2·L · (2(tp-1)/tp · T·h·2B / (link_bw·η_ar) + latency)

and the CPU's work on the step's path: `s_per_step + s_per_request·requests + s_per_token·T`.

Per GPU, the step's FLOPs are the groups' and its bytes their traffic: of it, the KV the T new tokens
write (`write_bytes_per_gpu`, vLLM's MFU estimate's write figure) and the rest read (weights, KV, and
spilled activations).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from emulation.config import CpuOverhead, OperatorEfficiencies
from emulation.profiles import GpuProfile, ModelProfile
from emulation.roofline import maximum, timed
from emulation.step_shape import StepItem, StepShape

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

    @property
    def total_s(self) -> float:
        return maximum(self.compute_s, self.memory_s)


@dataclass(frozen=True)
class OperatorStepTime:
    """Itemised time of one step, in emulated seconds: the groups, the all-reduces, the CPU."""

    groups: tuple[GroupTime, ...]
    all_reduce_s: float
    cpu_s: float
    kv_write_bytes: float = 0.0
    """Of the groups' bytes, the KV the step's new tokens write (one GPU's)."""

    @property
    def gpu_s(self) -> float:
        return sum(g.total_s for g in self.groups) + self.all_reduce_s

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
    """The per-operator time model of one engine replica: a target model on `tp` GPUs."""

    model: ModelProfile
    gpu: GpuProfile
    tp: int = 1
    eta: OperatorEfficiencies = field(default_factory=OperatorEfficiencies)
    cpu: CpuOverhead = field(default_factory=CpuOverhead)

    def step_time(self, items: Iterable[StepItem]) -> OperatorStepTime:
        return self.step_time_of(StepShape.of(items))

    def step_time_of(self, shape: StepShape) -> OperatorStepTime:
        """The time of a step of `shape` (no tokens: only the fixed CPU work)."""
        cpu_s = (
            self.cpu.s_per_step
            + self.cpu.s_per_request * shape.num_requests
            + self.cpu.s_per_token * shape.num_new_tokens
        )
        if shape.num_new_tokens == 0:
            return OperatorStepTime((), 0.0, cpu_s)
        written = 1.0 * shape.num_new_tokens * self.model.kv_bytes_per_token_per_gpu(self.tp)
        return OperatorStepTime(self.groups(shape), self.all_reduce_s(shape.num_new_tokens), cpu_s, written)

    def groups(self, shape: StepShape) -> tuple[GroupTime, ...]:
        m, tp, e = self.model, self.tp, self.eta
        t, L, dt = shape.num_new_tokens, m.num_layers, m.dtype_bytes
        h, i = m.hidden_size, m.intermediate_size
        q, kv = m.num_heads * m.head_dim, 2 * m.num_kv_heads * m.head_dim
        attn_params = h * (q + kv) + q * h
        mlp_params = 3 * h * i
        attn_flops_per_key = 4.0 * m.num_heads * m.head_dim * L / tp
        kv_per_token = m.kv_bytes_per_token_per_gpu(tp)
        vocab = m.vocab_size / tp
        return (
            self._group(
                "qkv_o",
                2.0 * L * attn_params * t / tp,
                L * (attn_params / tp * dt + self._spilled(t, h, (q + kv) / tp, q / tp, h)),
                e.gemm_compute,
                e.weights_bandwidth,
            ),
            self._group(
                "mlp",
                2.0 * L * mlp_params * t / tp,
                L * (mlp_params / tp * dt + self._spilled(t, h, 2 * i / tp, i / tp, h)),
                e.gemm_compute,
                e.weights_bandwidth,
            ),
            self._group(
                "prefill_attention",
                attn_flops_per_key * shape.prefill_keys_attended,
                kv_per_token * shape.prefill_kv_tokens,
                e.attention_compute,
                e.kv_bandwidth,
            ),
            self._group(
                "decode_attention",
                attn_flops_per_key * shape.decode_keys_attended,
                kv_per_token * shape.decode_keys_attended,
                e.attention_compute,
                e.kv_bandwidth,
            ),
            self._group(
                "logits",
                2.0 * vocab * h * shape.num_logits,
                (vocab * h * dt + shape.num_logits * vocab * LOGIT_BYTES) if shape.num_logits else 0.0,
                e.gemm_compute,
                e.weights_bandwidth,
            ),
        )

    def _spilled(self, num_tokens: int, *widths: float) -> float:
        """HBM bytes of activations `num_tokens` x each width: those larger than L2."""
        sizes = (num_tokens * w * self.model.dtype_bytes for w in widths)
        return sum(b for b in sizes if b > self.gpu.l2_cache_mb * 1e6)

    def all_reduce_s(self, num_tokens: int) -> float:
        """Two ring all-reduces per layer of `num_tokens` x hidden (none without TP)."""
        if self.tp == 1:
            return 0.0
        m, tp = self.model, self.tp
        message = num_tokens * m.hidden_size * m.dtype_bytes
        wire_s = 2 * (tp - 1) / tp * message / (self.gpu.tp_link_gbs * 1e9 * self.eta.all_reduce_bandwidth)
        return 2 * m.num_layers * (wire_s + self.gpu.all_reduce_latency_s)

    def _group(self, name: str, flops: float, nbytes: float, eta_c: float, eta_b: float) -> GroupTime:
        """One GPU's roofline (its share already taken: tp 1 here) of `flops` and `nbytes`."""
        t = timed(flops, nbytes, self.gpu, 1, eta_c, eta_b, 0.0)
        return GroupTime(name, flops, nbytes, t.compute_s, t.memory_s)
