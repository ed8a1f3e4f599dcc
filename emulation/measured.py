"""Measured step time (`target.time_model: measured`): the per-operator model's groups priced from
kernels measured on the target GPU (`emulation.kernel_tables`) wherever the tables hold them, the
per-operator roofline's where they do not.

Per GPU of the replica (one attention rank's share of the step, as `OperatorRoofline.groups` takes
it), each group is the kernels an engine step runs for it, each looked up at the step's real shape
and multiplied by the layers that run it::

    group              kernels (one layer's)                                   x layers
    qkv_o              GEMM [T, h] x [h, (q+kv)/tp]  +  GEMM [T, q/tp] x [q/tp, h]   attention layers
    mlp                GEMM [T, h] x [h, 2i/tp]      +  GEMM [T, i/tp] x [i/tp, h]   dense MLP layers
    prefill_attention  context attention: m chunks of n̄ new tokens after c̄ cached  attention layers
    decode_attention   generation attention: d decodes over k̄ cached tokens each    attention layers
    logits             GEMM [num_logits, h] x [h, V/tp]  (BF16)                      1
    shared_experts     router GEMM [T, h] x [h, E] (BF16) + the shared experts' two  MoE layers
    routed_experts     fused MoE on the skew's busiest EP rank (below)               MoE layers
    all-reduce         custom all-reduce of T x h over tp GPUs                       num_all_reduces

A step's chunks are priced as m equal ones: n̄ = P / m new tokens each after c̄ cached, solved from the
keys they attend (`step_shape.keys_attended`: K = m·(n̄·c̄ + n̄(n̄+1)/2)), exact for one chunk. Decodes
at their mean KV k̄ = keys / d (decode attention reads KV in proportion to it). A rank's fractional
share of chunks or decodes (data-parallel attention) is priced at the nearest whole count, scaled by
their ratio. The fused-MoE tables were measured with x tokens reaching one EP rank, each routed to
min(top-k, the rank's experts) of its experts, balanced; the busiest rank's assignments under the
routing skew (`ExpertLoad.rank_tokens`) are looked up as that many tokens, so the kernel does the
rank's work whatever the dispatch (DeepEP's, or vLLM's all-gather).

Where the tables have no such kernel (a weight format the GPU's tables lack, an MoE shape never
measured, MLA and SSM layers, sliding-window attention), the group keeps its roofline, and the step
says how much of its GPU time was measured (`OperatorStepTime.measured_s`). The CPU's work, the
all-to-alls and dual-batch overlap are the per-operator model's (`OperatorRoofline.step_time_of`).

Decode-only windows (`step_shape.decode_steps`) ask for many KV lengths at once: the generation
attention is looked up on a grid of 32 points an octave (every token below 64) and interpolated
linearly between the two points around each length, the same way for one step or a window of them,
so a window's steps and single steps get the same bits::

    k in [2^e, 2^(e+1)):   step = 2^max(0, e-5)        lo = step·floor(k / step)
                           t(k) = t(lo) + (k - lo)/step · (t(lo + step) - t(lo))
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from emulation.kernel_tables import KernelTables, KernelTime
from emulation.operators import GroupTime, OperatorRoofline, OperatorStepTime
from emulation.step_shape import StepItem, StepShape

KV_GRID_POINTS_PER_OCTAVE = 32
"""Generation attention's lookup grid over KV lengths (see the module's docstring)."""
GRID_SHIFT = KV_GRID_POINTS_PER_OCTAVE.bit_length() - 1


@dataclass(frozen=True)
class MeasuredGroupTime(GroupTime):
    """A group priced from kernel tables: `kernel_s` is its time (the roofline's `compute_s` and
    `memory_s` stay as what the roofline would have said); `measured_s` of it read from measured rows."""

    kernel_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.kernel_s

    def times(self, n: int) -> MeasuredGroupTime:
        g = super().times(n)
        kernel_s = n * self.kernel_s
        return MeasuredGroupTime(g.name, g.flops, g.bytes, g.compute_s, g.memory_s, g.measured_s, kernel_s)


@dataclass(frozen=True)
class MeasuredKernels(OperatorRoofline):
    """The measured time model of one engine replica: the per-operator roofline's groups, each priced
    from `tables` where they hold its kernels (see the module's docstring)."""

    tables: KernelTables = field(kw_only=True)
    _gemm_times: dict[tuple[int, int], dict[str, Any]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    """The GEMM groups' times by (tokens, logits): most steps repeat a few token counts."""

    def __post_init__(self) -> None:
        # The package loads a kernel family's table at its first lookup (~0.5 s each): a step with a
        # chunk and a decode loads every family here, before a live engine's clock starts.
        self.step_time_of(StepShape.of([StepItem(16, 16, True), StepItem(1, 16, True)]))

    def step_time_of(self, shape: StepShape) -> OperatorStepTime:
        step = super().step_time_of(shape)
        if not step.groups:
            return step
        measured = sum(g.measured_s for g in step.groups)
        if self.all_reduce_measured:
            measured = measured + step.all_reduce_s
        before_overlap = step.gpu_s + step.overlap_s  # dual-batch overlap hides measured time alike
        return dataclasses.replace(step, measured_s=measured * step.gpu_s / before_overlap)

    def groups(self, shape: StepShape) -> tuple[GroupTime, ...]:
        ex = self.experts
        rank = ex.busiest_rank(shape) if ex else shape
        kernels = self._kernel_times(rank)
        if ex is not None:
            kernels.update(self._expert_kernel_times(rank, shape.num_new_tokens))
        return tuple(self._priced(g, kernels.get(g.name)) for g in super().groups(shape))

    def all_reduce_s(self, num_tokens: float) -> float:
        if self.tp == 1 or not self.all_reduce_measured:
            return super().all_reduce_s(num_tokens)
        t = self.tables.all_reduce(_count(num_tokens), self.model.hidden_size, self.tp)
        assert t is not None  # all_reduce_measured
        return self.model.num_all_reduces * t.s

    @cached_property
    def all_reduce_measured(self) -> bool:
        """The tables hold the TP all-reduce of this model's hidden size over `tp` GPUs."""
        t = self.tables.all_reduce(1, self.model.hidden_size, self.tp) if self.tp > 1 else None
        return t is not None and t.measured

    @staticmethod
    def _priced(g: GroupTime, kernel: tuple[Any, Any] | None) -> GroupTime:
        """`g` priced at `kernel` (its time, its measured part), or its roofline where none."""
        if kernel is None:
            return g
        s, measured = kernel
        return MeasuredGroupTime(g.name, g.flops, g.bytes, g.compute_s, g.memory_s, measured, s)

    def _kernel_times(self, rank: StepShape) -> dict[str, tuple[Any, Any] | None]:
        """The dense groups' times from the tables over one attention rank's share of the step (None:
        a group whose kernels they lack)."""
        key = (_count(rank.num_new_tokens), _count(rank.num_logits, least=0))
        gemms = self._gemm_times.get(key)
        if gemms is None:
            gemms = self._gemm_times[key] = self._gemm_groups(*key)
        out = dict(gemms)
        if self.model.mla is None and not self.model.num_sliding_layers:
            out["prefill_attention"] = self._prefill_attention(rank)
            out["decode_attention"] = self._decode_attention(rank)
        return out

    def _gemm_groups(self, t: int, logits: int) -> dict[str, tuple[Any, Any] | None]:
        """The weight GEMMs' groups over `t` tokens, `logits` of them through the LM head."""
        m, tp = self.model, self.tp
        fmt, h = m.weight_format, m.hidden_size
        out: dict[str, tuple[Any, Any] | None] = {}
        if m.mla is None:
            heads, kv_heads, d, _ = self._attention_heads
            q = heads * d * (2 if m.attention_output_gate else 1)  # Qwen3-Next's q_proj adds its gate
            out["qkv_o"] = _layers(m.num_attention_layers, [
                self.tables.gemm(t, q + 2 * kv_heads * d, h, fmt), self.tables.gemm(t, h, heads * d, fmt)
            ])  # fmt: skip
        i, mlp_layers = m.intermediate_size, m.num_dense_mlp_layers
        out["mlp"] = _layers(mlp_layers, [
            self.tables.gemm(t, 2 * i // tp, h, fmt), self.tables.gemm(t, h, i // tp, fmt)
        ]) if mlp_layers and i else (0.0, 0.0)  # fmt: skip
        vocab = -(-m.vocab_size // tp)
        out["logits"] = _layers(1, [self.tables.gemm(logits, vocab, h, "bf16")]) if logits else (0.0, 0.0)
        return out

    def _prefill_attention(self, rank: StepShape) -> tuple[Any, Any] | None:
        """The step's prompt chunks as equal ones (the module's docstring), every attention layer."""
        num_chunks = rank.num_requests - rank.num_decodes
        if not rank.num_prefill_tokens or num_chunks <= 0:
            return (0.0, 0.0)
        n = rank.num_prefill_tokens / num_chunks
        cached = max(0.0, (rank.prefill_keys_attended / num_chunks - n * (n + 1) / 2) / n)
        heads, kv_heads, d, kvb = self._attention_heads
        whole = _count(num_chunks)
        t = self.tables.context_attention(whole, _count(n), _count(cached, least=0), heads, kv_heads, d, kvb)
        return _layers(self.model.num_attention_layers * num_chunks / whole, [t])

    def _decode_attention(self, rank: StepShape) -> tuple[Any, Any] | None:
        """The decodes at their mean KV, every attention layer; elementwise over a window's arrays."""
        if not rank.num_decodes:
            return (0.0, 0.0)
        heads, kv_heads, d, kvb = self._attention_heads
        whole = _count(rank.num_decodes)
        kv_len = rank.decode_keys_attended / rank.num_decodes

        def lookup(k: float) -> KernelTime | None:
            return self.tables.generation_attention(whole, int(k), heads, kv_heads, d, kvb)

        priced = _on_kv_grid(lookup, kv_len)
        if priced is None:
            return None
        layers = self.model.num_attention_layers * rank.num_decodes / whole
        return layers * priced[0], layers * priced[1]

    @cached_property
    def _attention_heads(self) -> tuple[int, int, int, int]:
        """Query heads, KV heads (at least one: replicated past num_kv_heads ranks), head size and KV
        element bytes, per GPU."""
        m, tp = self.model, self.tp
        return m.num_heads // tp, -(-m.num_kv_heads // tp), m.head_dim, m.kv_dtype_bytes

    def _expert_kernel_times(self, rank: StepShape, num_tokens: int) -> dict[str, tuple[Any, Any] | None]:
        """A MoE target's routers, shared experts and routed experts from the tables, over one attention
        rank's `rank` share of a step of `num_tokens` (all ranks')."""
        m, ex, tp = self.model, self.experts, self.tp
        assert ex is not None and m.moe is not None
        moe, h, layers = m.moe, m.hidden_size, m.num_moe_layers
        t = _count(rank.num_new_tokens)
        kernels = [self.tables.gemm(t, moe.num_experts, h, "bf16")]
        if shared := moe.shared_expert_intermediate_size:
            kernels += [self.tables.gemm(t, 2 * shared // tp, h, m.weight_format),
                        self.tables.gemm(t, h, shared // tp, m.weight_format)]  # fmt: skip
        # The tables' rows: `x` tokens at one EP rank, each to min(top-k, its experts) of them. The
        # busiest rank's assignments under the skew, as that many tokens (its work, whatever the dispatch).
        local = min(moe.num_experts_per_tok, max(1, moe.num_experts // ex.ep))
        x = _count(ex.placement.load(num_tokens).rank_tokens / local)
        routed = self.tables.moe(
            x, h, moe.moe_intermediate_size, moe.num_experts_per_tok, moe.num_experts, ex.tp, ex.ep,
            m.expert_format,
        )  # fmt: skip
        return {"shared_experts": _layers(layers, kernels), "routed_experts": _layers(layers, [routed])}


def _count(x: float, least: int = 1) -> int:
    """A step's (perhaps fractional: an average rank's share) count of tokens or requests, whole (a
    fractional count of requests is priced at the nearest whole one, scaled by their ratio)."""
    return max(least, round(float(x)))


def _layers(num_layers: float, kernels: list[KernelTime | None]) -> tuple[float, float] | None:
    """`kernels` run once a layer over `num_layers` layers: their time and its measured part (None:
    one of them has no table)."""
    if any(k is None for k in kernels):
        return None
    s = sum(k.s for k in kernels if k is not None)
    measured = sum(k.s for k in kernels if k is not None and k.measured)
    return num_layers * s, num_layers * measured


def _on_kv_grid(lookup: Callable[[float], KernelTime | None], kv_len: Any) -> tuple[Any, Any] | None:
    """`lookup` at the KV length `kv_len` (or each of an array's), interpolated on the module's grid:
    its time and measured part (None: no table). One length or many, the same operations on the same
    doubles (the grid from frexp, powers of two: exact), so the same bits."""
    k: Any  # a length, or an array of them: the same operations on either
    s: Any
    measured: Any
    if isinstance(kv_len, np.ndarray):
        k = np.maximum(kv_len, 1.0)
        step = np.ldexp(1.0, np.maximum(0, np.frexp(k)[1] - 1 - GRID_SHIFT))
        lo = step * np.floor(k / step)
        points = np.unique(np.concatenate([lo, lo + step]))
        answers = [lookup(p) for p in points.tolist()]
        if any(a is None for a in answers):
            return None
        s = np.array([a.s for a in answers if a is not None])
        measured = np.array([a.s if a.measured else 0.0 for a in answers if a is not None])
        at_lo, at_hi = np.searchsorted(points, lo), np.searchsorted(points, lo + step)
    else:
        k = max(float(kv_len), 1.0)
        step = math.ldexp(1.0, max(0, math.frexp(k)[1] - 1 - GRID_SHIFT))
        lo = step * math.floor(k / step)
        low, high = lookup(lo), lookup(lo + step)
        if low is None or high is None:
            return None
        s = [low.s, high.s]
        measured = [low.s if low.measured else 0.0, high.s if high.measured else 0.0]
        at_lo, at_hi = 0, 1
    frac = (k - lo) / step
    return s[at_lo] + frac * (s[at_hi] - s[at_lo]), measured[at_lo] + frac * (
        measured[at_hi] - measured[at_lo]
    )
