"""MLA's attention from the kernel tables (`emulation.measured`), DeepSeek-V3's geometry only
(`kernel_tables.MLA_GEOMETRY`), per GPU of a `tp`-way attention rank, over the MLA layers::

    where the tables hold the whole module (vLLM, TRT-LLM), every projection included:
    qkv_o              0
    prefill_attention  MLA context module: m chunks of n̄ new tokens after c̄ cached
    decode_attention   MLA generation module: d decodes over k̄ cached tokens each
    else, as kernels (SGLang):
    qkv_o              GEMMs [T, h] x [h, q_lora + kv_lora + rope], [T, q_lora] x [q_lora, H·192/tp],
                       [T, H·128/tp] x [H·128/tp, h]
    prefill_attention  KV up projection GEMM over the chunks' keys + the MLA prefill kernel
    decode_attention   absorbed query BMM + the MLA decode kernel + absorbed output BMM
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from emulation.kernel_tables import MLA_MODULE_HIDDEN_SIZE, KernelTables, KernelTime
from emulation.profiles import ModelProfile
from emulation.step_kernels import chunks_of, decodes_of, layers_of, on_kv_grid, scaled, total, whole_count
from emulation.step_shape import StepShape


@dataclass(frozen=True)
class MlaKernels:
    """An MLA model's attention groups from `tables` (see the module's docstring)."""

    tables: KernelTables
    model: ModelProfile
    tp: int

    def groups(self, rank: StepShape) -> dict[str, tuple[Any, Any] | None]:
        """The attention groups over one attention rank's share of a step, whole modules where the
        tables hold them (None: a group whose kernels they lack, keeping its roofline)."""
        return self._module(rank) or self._kernels(rank)

    def _module(self, rank: StepShape) -> dict[str, tuple[Any, Any] | None]:
        """An MLA model's attention blocks as the tables measured them, whole: the chunks' through the
        context module and the decodes' through the generation module, each with every projection
        (so `qkv_o` is theirs); {} where the tables lack either, or measured another hidden size."""
        m, layers = self.model, self.model.num_attention_layers
        heads, fmt, kvb = m.num_heads // self.tp, m.weight_format, m.kv_dtype_bytes
        if m.hidden_size != MLA_MODULE_HIDDEN_SIZE:
            return {}
        prefill: tuple[Any, Any] | None = (0.0, 0.0)
        if (chunks := chunks_of(rank)) is not None:
            whole, n, cached, ratio = chunks
            prefill = layers_of(layers * ratio, [self.tables.mla_context(whole, n, cached, heads, kvb, fmt)])
        decode: tuple[Any, Any] | None = (0.0, 0.0)
        if rank.num_decodes:
            whole, kv_len, ratio = decodes_of(rank)

            def lookup(k: float) -> KernelTime | None:
                return self.tables.mla_generation(whole, int(k), heads, kvb, fmt)

            decode = scaled(layers * ratio, on_kv_grid(lookup, kv_len))
        if prefill is None or decode is None:
            return {}
        return {"qkv_o": (0.0, 0.0), "prefill_attention": prefill, "decode_attention": decode}

    def _kernels(self, rank: StepShape) -> dict[str, tuple[Any, Any] | None]:
        """An MLA model's attention as separate kernels, where the tables hold no whole module (SGLang's):
        the projections every token runs as GEMMs (`qkv_o`); the chunks' KV up projection, over their
        cached keys too, and the prefill attention kernel; the decodes' absorbed query product, latent
        attention kernel and absorbed output product."""
        m, tp, g, layers = self.model, self.tp, self.model.mla, self.model.num_attention_layers
        assert g is not None
        heads, fmt, kvb, h = m.num_heads // tp, m.weight_format, m.kv_dtype_bytes, m.hidden_size
        t = whole_count(rank.num_new_tokens)
        q_in = g.q_lora_rank or h  # queries from their latent, or straight from the hidden state
        down = (g.q_lora_rank or 0) + g.kv_lora_rank + g.qk_rope_head_dim
        out: dict[str, tuple[Any, Any] | None] = {"qkv_o": layers_of(layers, [
            self.tables.gemm(t, down, h, fmt), self.tables.gemm(t, heads * g.qk_head_dim, q_in, fmt),
            self.tables.gemm(t, h, heads * g.v_head_dim, fmt),
        ])}  # fmt: skip
        out["prefill_attention"] = out["decode_attention"] = (0.0, 0.0)
        if (chunks := chunks_of(rank)) is not None:
            whole, n, cached, ratio = chunks
            kv_up = heads * (g.qk_nope_head_dim + g.v_head_dim)
            out["prefill_attention"] = layers_of(layers * ratio, [
                self.tables.gemm(whole * (n + cached), kv_up, g.kv_lora_rank, fmt),
                self.tables.mla_context_attention(whole, n, cached, heads, kvb),
            ])  # fmt: skip
        if rank.num_decodes:
            whole, kv_len, ratio = decodes_of(rank)
            bmms = layers_of(
                layers * ratio, [self.tables.mla_bmm(whole, heads, fmt, before) for before in (True, False)]
            )

            def lookup(k: float) -> KernelTime | None:
                return self.tables.mla_generation_attention(whole, int(k), heads, kvb)

            out["decode_attention"] = total([bmms, scaled(layers * ratio, on_kv_grid(lookup, kv_len))])
        return out
