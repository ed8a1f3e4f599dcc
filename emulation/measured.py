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
    elementwise        residual adds + RMSNorms, gated activations: no table, the   every layer
                       package's bandwidth formula (`emulation.measured_elementwise`)
    shared_experts     router GEMM [T, h] x [h, E] (BF16) + the shared experts' two  MoE layers
    routed_experts     fused MoE on the skew's busiest EP rank (below)               MoE layers
    all-reduce         custom all-reduce of T x h over tp GPUs                       num_all_reduces

    MLA (DeepSeek-V3's geometry): qkv_o and the attention groups as `emulation.measured_mla` reads them

    gated delta nets (Qwen3-Next, Qwen3.5), per GDN layer
    ssm_proj           GEMMs in_proj_qkvz [h, 2(k+v)/tp], in_proj_ba [h, 2Hv/tp], out_proj [v/tp, h]
    ssm_scan           causal conv1d + chunked delta rule over m chunks of n̄;  conv1d update +
                       recurrent delta rule over d decodes

    sliding-window layers (gpt-oss): their attention looked up with the window (their chunks after no
    prefix: a window's work does not grow with what lies behind it)

A step's chunks are priced as m equal ones, its decodes at their mean KV read on a grid of KV lengths,
its weight GEMMs and element-wise kernels at its token count on the same grid (`emulation.step_kernels`).
The fused-MoE tables were measured with x tokens reaching one EP rank, each routed to min(top-k, the
rank's experts) of its experts, balanced; the busiest rank's assignments under the routing skew
(`ExpertLoad.rank_tokens`) are looked up as that many tokens, so the kernel does the rank's work
whatever the dispatch (DeepEP's, or vLLM's all-gather).

Where the tables have no such kernel (a weight format the GPU's tables lack, an MoE shape never
measured, MLA of another geometry, Mamba2 layers), the group keeps its roofline, and the step
says how much of its GPU time was measured (`OperatorStepTime.measured_s`). With data-parallel attention
the all-to-alls are DeepEP's measured dispatch and combine (low-latency kernels for decode-only steps,
high-throughput ones else, at the step's tokens a rank) where the tables hold the EP ranks and nodes,
the per-operator model's elsewhere. The CPU's work and dual-batch overlap are the per-operator model's
(`OperatorRoofline.step_time_of`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from emulation.kernel_tables import MLA_GEOMETRY, KernelTables, KernelTime
from emulation.measured_elementwise import ElementwiseKernels
from emulation.measured_mla import MlaKernels
from emulation.operators import GroupTime, OperatorRoofline, OperatorStepTime
from emulation.ssm import GatedDeltaNetGeometry
from emulation.step_kernels import (
    between,
    chunks_of,
    decodes_of,
    grid_bracket,
    layers_of,
    on_kv_grid,
    scaled,
    total,
    whole_count,
)
from emulation.step_shape import StepItem, StepShape


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
    _weight_times: dict[int, dict[str, Any]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    """The weight GEMMs' and element-wise groups by a grid point's tokens (`_weight_groups`)."""
    _logit_times: dict[int, Any] = field(default_factory=dict, init=False, compare=False, repr=False)
    """The LM head by its tokens (`_logits`)."""
    _elementwise_groups: dict[float, GroupTime] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    """The element-wise group by a rank's tokens, likewise."""

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
        if self.all_to_all_measured:
            measured = measured + step.all_to_all_s
        gpu_s = step.gpu_s
        before_overlap = gpu_s + step.overlap_s  # dual-batch overlap hides measured time alike
        return dataclasses.replace(step, measured_s=measured * gpu_s / before_overlap)

    def groups(self, shape: StepShape) -> tuple[GroupTime, ...]:
        ex = self.experts
        rank = ex.busiest_rank(shape) if ex else shape
        kernels = self._kernel_times(rank)
        if ex is not None:
            kernels.update(self._expert_kernel_times(rank, shape.num_new_tokens))
        priced = tuple(self._priced(g, kernels.get(g.name)) for g in super().groups(shape))
        return (*priced, self._elementwise(rank, kernels["elementwise"]))

    def all_reduce_s(self, num_tokens: float) -> float:
        if self.tp == 1 or not self.all_reduce_measured:
            return super().all_reduce_s(num_tokens)
        t = self.tables.all_reduce(whole_count(num_tokens), self.model.hidden_size, self.tp)
        assert t is not None  # all_reduce_measured
        return self.model.num_all_reduces * t.s

    @cached_property
    def all_reduce_measured(self) -> bool:
        """The tables hold the TP all-reduce of this model's hidden size over `tp` GPUs."""
        t = self.tables.all_reduce(1, self.model.hidden_size, self.tp) if self.tp > 1 else None
        return t is not None and t.measured

    def all_to_all_s(self, shape: StepShape) -> float:
        if not self.all_to_all_measured:
            return super().all_to_all_s(shape)
        x = whole_count(shape.num_new_tokens / self._deepep_shape[3])
        low_latency = not shape.num_prefill_tokens  # decode-only steps: DeepEP's low-latency kernels
        phases = [
            self.tables.deepep(x, phase, low_latency, *self._deepep_shape)
            for phase in ("dispatch", "combine")
        ]
        if any(k is None for k in phases):  # outside what the package answers: the testbed's own
            return super().all_to_all_s(shape)
        return self.model.num_moe_layers * sum(k.s for k in phases if k is not None)

    @cached_property
    def all_to_all_measured(self) -> bool:
        """The tables measured DeepEP's dispatch and combine, both kinds, for this model over these EP
        ranks and nodes (vLLM's: 8 ranks on one node; elsewhere the package reuses those rows, and the
        per-operator model's all-to-all, which sees the nodes, stays)."""
        if self.experts is None or self.experts.all_to_all is None:
            return False
        kernels = [self.tables.deepep(1, phase, low_latency, *self._deepep_shape)
                   for phase in ("dispatch", "combine") for low_latency in (True, False)]  # fmt: skip
        return all(k is not None and k.measured for k in kernels)

    @cached_property
    def _deepep_shape(self) -> tuple[int, int, int, int, int]:
        """Hidden size, top-k, experts, EP ranks and nodes, as DeepEP's tables key them."""
        m, ex = self.model, self.experts
        assert m.moe is not None and ex is not None and ex.all_to_all is not None
        a2a = ex.all_to_all
        return m.hidden_size, m.moe.num_experts_per_tok, m.moe.num_experts, a2a.ep, a2a.num_nodes

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
        t = whole_count(rank.num_new_tokens)
        lo, step = grid_bracket(t)
        low = self._weight_groups(int(lo))
        if t > lo:  # between two of the grid's points (`emulation.step_kernels`)
            high, frac = self._weight_groups(int(lo + step)), (t - lo) / step
            out = {name: between(g, high[name], frac) for name, g in low.items()}
        else:
            out = dict(low)
        out["logits"] = self._logits(whole_count(rank.num_logits, least=0))
        if self.model.mla is None:
            out["prefill_attention"] = self._prefill_attention(rank)
            out["decode_attention"] = self._decode_attention(rank)
        elif self.model.mla == MLA_GEOMETRY:
            out.update(self._mla.groups(rank))
        if isinstance(self.model.ssm, GatedDeltaNetGeometry):
            out["ssm_scan"] = self._gdn_scan(rank)
        return out

    def _logits(self, num_logits: int) -> tuple[Any, Any] | None:
        """The LM head over the tokens sampled (BF16, the vocabulary split over the TP ranks)."""
        if num_logits not in self._logit_times:
            vocab, h = -(-self.model.vocab_size // self.tp), self.model.hidden_size
            self._logit_times[num_logits] = (
                layers_of(1, [self.tables.gemm(num_logits, vocab, h, "bf16")]) if num_logits else (0.0, 0.0)
            )
        return self._logit_times[num_logits]

    def _weight_groups(self, t: int) -> dict[str, tuple[Any, Any] | None]:
        """The groups over `t` tokens that every token runs through alike, their weight GEMMs and
        element-wise kernels (cached: a step's token count is read on the grid)."""
        if (groups := self._weight_times.get(t)) is not None:
            return groups
        m, tp = self.model, self.tp
        fmt, h = m.weight_format, m.hidden_size
        out: dict[str, tuple[Any, Any] | None] = {}
        if m.mla is None:
            heads, kv_heads, d, _ = self._attention_heads
            q = heads * d * (2 if m.attention_output_gate else 1)  # Qwen3-Next's q_proj adds its gate
            out["qkv_o"] = layers_of(m.num_attention_layers, [
                self.tables.gemm(t, q + 2 * kv_heads * d, h, fmt), self.tables.gemm(t, h, heads * d, fmt)
            ])  # fmt: skip
        i, mlp_layers = m.intermediate_size, m.num_dense_mlp_layers
        out["mlp"] = layers_of(mlp_layers, [
            self.tables.gemm(t, 2 * i // tp, h, fmt), self.tables.gemm(t, h, i // tp, fmt)
        ]) if mlp_layers and i else (0.0, 0.0)  # fmt: skip
        if isinstance(g := m.ssm, GatedDeltaNetGeometry):
            keys, values = g.num_key_heads * g.key_head_dim, g.num_value_heads * g.value_head_dim
            out["ssm_proj"] = layers_of(m.num_ssm_layers, [
                self.tables.gemm(t, 2 * (keys + values) // tp, h, fmt),  # in_proj_qkvz
                self.tables.gemm(t, 2 * g.num_value_heads // tp, h, fmt),  # in_proj_ba
                self.tables.gemm(t, h, values // tp, fmt),  # out_proj
            ])  # fmt: skip
        out["elementwise"] = self._elementwise_kernels.times(t)
        self._weight_times[t] = out
        return out

    @cached_property
    def _elementwise_kernels(self) -> ElementwiseKernels:
        return ElementwiseKernels(self.tables, self.model, self.tp)

    def _elementwise(self, rank: StepShape, kernels: tuple[Any, Any] | None) -> GroupTime:
        """The element-wise kernels' group of a rank's step, priced at `kernels`; its roofline (BF16 in
        and out, at the KV bandwidth's efficiency) says what the per-operator model would have, which
        folds them into its fitted efficiencies instead."""
        key = float(rank.num_new_tokens)
        if key not in self._elementwise_groups:
            nbytes = self._elementwise_kernels.bytes(key)
            e = self.eta
            roofline = self._group("elementwise", 0.0, nbytes, e.attention_compute, e.kv_bandwidth)
            self._elementwise_groups[key] = self._priced(roofline, kernels)
        return self._elementwise_groups[key]

    def _prefill_attention(self, rank: StepShape) -> tuple[Any, Any] | None:
        """The step's prompt chunks as equal ones (the module's docstring), every attention layer: the
        full ones over their prefix, the sliding-window ones over their window."""
        chunks = chunks_of(rank)
        if chunks is None:
            return (0.0, 0.0)
        whole, n, cached, ratio = chunks
        m, (heads, kv_heads, d, kvb) = self.model, self._attention_heads
        full = m.num_attention_layers - m.num_sliding_layers
        parts = [layers_of(full * ratio, [
            self.tables.context_attention(whole, n, cached, heads, kv_heads, d, kvb)
        ])] if full else []  # fmt: skip
        if m.num_sliding_layers:
            assert m.sliding_window is not None
            # A window's work does not grow with the prefix behind it: looked up after none.
            parts.append(layers_of(m.num_sliding_layers * ratio, [
                self.tables.context_attention(whole, n, 0, heads, kv_heads, d, kvb, window=m.sliding_window)
            ]))  # fmt: skip
        return total(parts)

    def _decode_attention(self, rank: StepShape) -> tuple[Any, Any] | None:
        """The decodes at their mean KV, every attention layer (sliding-window ones over their window);
        elementwise over a window's arrays."""
        if not rank.num_decodes:
            return (0.0, 0.0)
        m, (heads, kv_heads, d, kvb) = self.model, self._attention_heads
        whole, kv_len, ratio = decodes_of(rank)
        parts = []
        for layers, window in ((m.num_attention_layers - m.num_sliding_layers, 0),
                               (m.num_sliding_layers, m.sliding_window or 0)):  # fmt: skip
            if not layers:
                continue

            def lookup(k: float, window: int = window) -> KernelTime | None:
                return self.tables.generation_attention(whole, int(k), heads, kv_heads, d, kvb, window)

            parts.append(scaled(layers * ratio, on_kv_grid(lookup, kv_len)))
        return total(parts)

    def _gdn_scan(self, rank: StepShape) -> tuple[Any, Any] | None:
        """A gated-delta-net model's scans: each layer's convolution and chunked delta rule over the
        prompt chunks (as equal ones), its convolution update and recurrent rule over the decodes."""
        m, tp, g = self.model, self.tp, self.model.ssm
        assert isinstance(g, GatedDeltaNetGeometry)
        shape = (m.hidden_size, g.num_key_heads // tp, g.key_head_dim, g.num_value_heads // tp,
                 g.value_head_dim, g.conv_kernel)  # fmt: skip
        parts = []
        if (chunks := chunks_of(rank)) is not None:
            whole, n, _, ratio = chunks
            parts.append(layers_of(m.num_ssm_layers * ratio, [
                self.tables.gdn(kernel, whole, n, *shape)
                for kernel in ("causal_conv1d_fn", "chunk_gated_delta_rule")
            ]))  # fmt: skip
        if rank.num_decodes:
            whole, _, ratio = decodes_of(rank)
            parts.append(layers_of(m.num_ssm_layers * ratio, [
                self.tables.gdn(kernel, whole, 1, *shape)
                for kernel in ("causal_conv1d_update", "fused_sigmoid_gating_delta_rule_update")
            ]))  # fmt: skip
        return total(parts)

    @cached_property
    def _mla(self) -> MlaKernels:
        return MlaKernels(self.tables, self.model, self.tp)

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
        t = whole_count(rank.num_new_tokens)
        kernels = [self.tables.gemm(t, moe.num_experts, h, "bf16")]
        if shared := moe.shared_expert_intermediate_size:
            kernels += [self.tables.gemm(t, 2 * shared // tp, h, m.weight_format),
                        self.tables.gemm(t, h, shared // tp, m.weight_format)]  # fmt: skip
        # The tables' rows: `x` tokens at one EP rank, each to min(top-k, its experts) of them. The
        # busiest rank's assignments under the skew, as that many tokens (its work, whatever the dispatch).
        local = min(moe.num_experts_per_tok, max(1, moe.num_experts // ex.ep))
        x = whole_count(ex.placement.load(num_tokens).rank_tokens / local)
        routed = self.tables.moe(
            x, h, moe.moe_intermediate_size, moe.num_experts_per_tok, moe.num_experts, ex.tp, ex.ep,
            m.expert_format,
        )  # fmt: skip
        return {"shared_experts": layers_of(layers, kernels), "routed_experts": layers_of(layers, [routed])}
