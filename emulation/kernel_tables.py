"""Kernel latencies measured on real GPUs: aiconfigurator-core's per-kernel tables, queried at a step's
own shapes.

The package (NVIDIA, Apache-2.0) ships, per GPU and serving backend version, latencies of the kernels
an engine step runs, measured on silicon (`systems/data/<gpu>/<family>/<backend>/<version>/*.parquet`:
107k GEMM shapes on H100 for vLLM 0.24.0 alone), and a Rust engine that interpolates them: linear
along each measured axis (context attention in sqrt(latency) along the sequence), and outside what was
measured, the nearest points' share of the roofline held. That engine is the library made for the
job, so every lookup goes through it (`EngineHandle.evaluate_ops_json`); nothing here reads a table.

Each lookup answers one kernel at one shape, in seconds, with where its number came from
(`KernelTime.measured`: the tables, or the package's own roofline where they hold nothing near), or
None where the package has no answer at all (a format the GPU's tables lack): the caller then prices
that kernel its own way. Answers are cached by shape: an uncached GEMM costs ~100 µs, a cached one a
dictionary lookup.

Units the tables use and the lookups hide: all-reduce message sizes are elements (tokens x hidden),
not bytes; DeepEP tables hold µs; a context-attention table has no prefix axis (the package scales a
chunk after a prefix by (full² - prefix²) / full²); a generation-attention lookup averages five KV
lengths within ±10 %. MLA is measured for DeepSeek-V3's geometry only, at each per-GPU head count: as
a whole module (vLLM's and TRT-LLM's `DeepseekV2MLAAttention` forward, every projection included), or
as its attention kernels and absorbed batched products (SGLang); the gated delta net as its four
kernels, at Qwen3.5's head sizes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from emulation.mla import MlaGeometry
from emulation.silicon_systems import missing_package_line

BACKEND_VERSION = "current"
"""The tables' default version: the package's `current` slot (vLLM 0.24.0 on Hopper and Blackwell in
0.12.0); `next` or a slot's version number name others."""

GEMM_FORMATS = {"bf16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4",
                "int4_wo": "int4_wo"}  # fmt: skip
"""`target.quantization` formats as the tables' GEMM modes (MXFP4 is an experts-only format: none)."""
MOE_FORMATS = {"bf16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4",
               "mxfp4": "w4a16_mxfp4", "int4_wo": "int4_wo"}  # fmt: skip
"""The same for the fused-MoE tables."""
KV_FORMATS = {2: "bfloat16", 1: "fp8"}
"""KV cache element bytes as the attention tables' KV modes."""
GDN_KERNELS = {
    "causal_conv1d_fn": "context",
    "chunk_gated_delta_rule": "context",
    "causal_conv1d_update": "generation",
    "fused_sigmoid_gating_delta_rule_update": "generation",
}
"""A gated delta net's kernels, by the package's names, and the phase each runs in (the package maps
them to the kernels each backend measured, e.g. vLLM's FlashInfer chunked rule)."""
MLA_GEOMETRY = MlaGeometry(512, 128, 64, 128, q_lora_rank=1536)
"""The MLA geometry the MLA tables measured (DeepSeek-V3's; Kimi K2 shares it): their attention kernels
take its latent and head sizes, their whole modules its projections too, at hidden size
`MLA_MODULE_HIDDEN_SIZE`."""
MLA_MODULE_HIDDEN_SIZE = 7168
MEASURED_SOURCES = ("silicon", "mixed")
"""The package's names for an answer read from measured rows (`mixed`: measured attention plus its
small analytic parts, RoPE and the KV write); the others (`sol`, `empirical`) are its roofline."""


TABLE_SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "a100-80gb": "a100_sxm", "b200": "b200_sxm"}
"""The hand-typed GPUs (`emulation.profiles`) the package measured, by its system names; every other GPU
name is already one (or has no tables: H800, Ascend 910C)."""


class KernelTablesError(ValueError):
    """The tables cannot be opened for this GPU and backend (one line: what, and what is allowed)."""


@dataclass(frozen=True)
class KernelTime:
    """One kernel at one shape."""

    s: float
    measured: bool
    """Read from the GPU's measured rows (else the package's roofline, where they hold nothing near)."""


class KernelTables:
    """One GPU's kernel tables for one serving backend (`system`: a name aiconfigurator-core ships,
    e.g. h100_sxm; `backend`: vllm, sglang or trtllm; `version`: a slot, `current` or `next`, or its
    version number)."""

    def __init__(self, system: str, backend: str = "vllm", version: str = BACKEND_VERSION) -> None:
        pkg = _package()
        try:
            database = pkg.perf_database.get_database(system, backend, version)
        except (ValueError, RuntimeError, KeyError, FileNotFoundError) as e:
            raise KernelTablesError(
                f"no {backend} {version} kernel tables for {system}: {str(e).splitlines()[0]}"
            ) from None
        if database is None:
            raise KernelTablesError(f"no {backend} {version} kernel tables for {system}")
        self.system, self.backend, self.version = system, backend, str(database.version)
        self._pkg = pkg
        self._engine = pkg.EngineHandle.for_database(database)
        self._answers: dict[tuple[Any, ...], KernelTime | None] = {}

    def __repr__(self) -> str:
        return f"KernelTables({self.system}, {self.backend} {self.version})"

    def gemm(self, num_tokens: int, n: int, k: int, weight_format: str) -> KernelTime | None:
        """A GEMM of `num_tokens` rows by a [k, n] weight of `weight_format` (a `target.quantization`
        format; None where the tables have no such mode)."""
        mode = GEMM_FORMATS.get(weight_format)
        if mode is None:
            return None
        return self._lookup(
            ("gemm", n, k, mode), dict(x=num_tokens),
            lambda: self._pkg.GEMM("gemm", 1.0, n, k, self._pkg.GEMMQuantMode[mode]),
        )  # fmt: skip

    def context_attention(
        self, num_requests: int, num_new_tokens: int, num_cached_tokens: int, num_heads: int,
        num_kv_heads: int, head_dim: int, kv_bytes: int, window: int = 0,
    ) -> KernelTime | None:  # fmt: skip
        """Prefill attention of `num_requests` chunks of `num_new_tokens` each after `num_cached_tokens`
        in the cache, `num_heads` query and `num_kv_heads` KV heads a GPU, KV of `kv_bytes` an element;
        `window`: a sliding-window layer's (0: full attention)."""
        kv = self._pkg.KVCacheQuantMode[KV_FORMATS[kv_bytes]]
        return self._lookup(
            ("context_attention", num_heads, num_kv_heads, head_dim, kv_bytes, window),
            dict(batch_size=num_requests, s=num_new_tokens, prefix=num_cached_tokens),
            lambda: self._pkg.ContextAttention(
                "attention", 1.0, num_heads, num_kv_heads, kv, self._pkg.FMHAQuantMode.bfloat16,
                head_size=head_dim, window_size=window,
            ),
        )  # fmt: skip

    def generation_attention(
        self, num_requests: int, kv_len: int, num_heads: int, num_kv_heads: int, head_dim: int, kv_bytes: int,
        window: int = 0,
    ) -> KernelTime | None:  # fmt: skip
        """Decode attention of `num_requests` single-token queries over `kv_len` cached tokens each."""
        kv = self._pkg.KVCacheQuantMode[KV_FORMATS[kv_bytes]]
        return self._lookup(
            ("generation_attention", num_heads, num_kv_heads, head_dim, kv_bytes, window),
            dict(batch_size=num_requests, s=kv_len),
            lambda: self._pkg.GenerationAttention(
                "attention", 1.0, num_heads, num_kv_heads, kv, head_size=head_dim, window_size=window
            ),
            is_context=False,
        )

    def mla_context(
        self, num_requests: int, num_new_tokens: int, num_cached_tokens: int, num_heads: int,
        kv_bytes: int, weight_format: str,
    ) -> KernelTime | None:  # fmt: skip
        """A DeepSeek-V3 MLA layer's whole attention block over `num_requests` prompt chunks (`num_heads`
        a GPU): its projections (the fused down projection, the query and KV up projections, the
        output projection with `weight_format` weights) and the prefill attention, as vLLM's
        `DeepseekV2MLAAttention.forward` runs it."""
        at = dict(batch_size=num_requests, s=num_new_tokens, prefix=num_cached_tokens)
        return self._mla(True, weight_format, num_heads, kv_bytes, at)

    def mla_generation(
        self, num_requests: int, kv_len: int, num_heads: int, kv_bytes: int, weight_format: str
    ) -> KernelTime | None:
        """The same block for `num_requests` decodes over `kv_len` cached tokens each (the absorbed
        query and output BMMs, the latent attention)."""
        return self._mla(False, weight_format, num_heads, kv_bytes, dict(batch_size=num_requests, s=kv_len))

    def _mla(
        self, is_context: bool, weight_format: str, num_heads: int, kv_bytes: int, at: dict[str, int]
    ) -> KernelTime | None:
        mode = GEMM_FORMATS.get(weight_format)
        if mode is None:
            return None
        kv = self._pkg.KVCacheQuantMode[KV_FORMATS[kv_bytes]]
        return self._lookup(
            ("mla", is_context, num_heads, kv_bytes, mode), at,
            lambda: self._pkg.MLAModule(
                "mla", 1.0, is_context, num_heads, kv, self._pkg.FMHAQuantMode.bfloat16,
                self._pkg.GEMMQuantMode[mode],
            ),
            is_context=is_context,
        )  # fmt: skip

    def mla_context_attention(
        self, num_requests: int, num_new_tokens: int, num_cached_tokens: int, num_heads: int, kv_bytes: int
    ) -> KernelTime | None:
        """MLA's prefill attention kernel alone (no projections; DeepSeek-V3's head sizes), where the
        tables hold it but not the whole module (SGLang)."""
        kv = self._pkg.KVCacheQuantMode[KV_FORMATS[kv_bytes]]
        return self._lookup(
            ("mla_context_attention", num_heads, kv_bytes),
            dict(batch_size=num_requests, s=num_new_tokens, prefix=num_cached_tokens),
            lambda: self._pkg.ContextMLA("mla", 1.0, num_heads, kv, self._pkg.FMHAQuantMode.bfloat16),
        )

    def mla_generation_attention(
        self, num_requests: int, kv_len: int, num_heads: int, kv_bytes: int
    ) -> KernelTime | None:
        """MLA's decode attention kernel alone, over the latent cache."""
        kv = self._pkg.KVCacheQuantMode[KV_FORMATS[kv_bytes]]
        return self._lookup(
            ("mla_generation_attention", num_heads, kv_bytes), dict(batch_size=num_requests, s=kv_len),
            lambda: self._pkg.GenerationMLA("mla", 1.0, num_heads, kv), is_context=False,
        )  # fmt: skip

    def mla_bmm(self, num_tokens: int, num_heads: int, weight_format: str, before: bool) -> KernelTime | None:
        """A decode's absorbed MLA batched product, `before` the attention (the query into the latent
        space) or after it (the latent output into the value heads); FP8 unless the weights are BF16."""
        mode = "bfloat16" if weight_format == "bf16" else "fp8"
        return self._lookup(
            ("mla_bmm", num_heads, mode, before), dict(batch_size=num_tokens),
            lambda: self._pkg.MLABmm("mla", 1.0, num_heads, self._pkg.GEMMQuantMode[mode], if_pre=before),
            is_context=False,
        )  # fmt: skip

    def gdn(
        self, kernel: str, num_requests: int, num_new_tokens: int, hidden_size: int, num_key_heads: int,
        key_head_dim: int, num_value_heads: int, value_head_dim: int, conv_kernel: int,
    ) -> KernelTime | None:  # fmt: skip
        """One gated-delta-net kernel of a layer (`GDN_KERNELS`: the causal convolution or the delta rule,
        of prompt chunks or decodes) over `num_requests` chunks of `num_new_tokens` each (decodes: 1),
        `num_key_heads` and `num_value_heads` a GPU."""
        phase = GDN_KERNELS[kernel]
        shape = (hidden_size, num_key_heads, key_head_dim, num_value_heads, value_head_dim, conv_kernel)
        return self._lookup(
            ("gdn", kernel, *shape), dict(batch_size=num_requests, s=num_new_tokens),
            lambda: self._pkg.GDNKernel("gdn", 1.0, kernel, phase, *shape),
            is_context=phase == "context",
        )  # fmt: skip

    def all_reduce(self, num_tokens: int, hidden_size: int, tp: int) -> KernelTime | None:
        """One all-reduce of `num_tokens` x `hidden_size` BF16 activations over `tp` GPUs (the
        backend's custom all-reduce, as its CUDA graphs run it)."""
        return self._lookup(
            ("all_reduce", hidden_size, tp), dict(x=num_tokens),
            lambda: self._pkg.CustomAllReduce("all_reduce", 1.0, hidden_size, tp),
        )  # fmt: skip

    def moe(
        self, num_tokens: int, hidden_size: int, moe_intermediate_size: int, top_k: int, num_experts: int,
        moe_tp: int, moe_ep: int, expert_format: str, distribution: str = "balanced",
    ) -> KernelTime | None:  # fmt: skip
        """One MoE layer's experts (routing, grouped GEMMs, combine) on one EP rank that `num_tokens`
        tokens reach, each routed to min(`top_k`, its experts) of its experts (as the tables measured
        it: at EP 256, 16,384 tokens of one expert each), experts split `moe_tp` ways and spread over
        `moe_ep` ranks; `distribution`: the tables' token skew (balanced, power_law_1.01,
        power_law_1.2)."""
        mode = MOE_FORMATS.get(expert_format)
        if mode is None:
            return None
        shape = (hidden_size, moe_intermediate_size, top_k, num_experts, moe_tp, moe_ep, mode, distribution)
        return self._lookup(
            ("moe", *shape), dict(x=num_tokens),
            lambda: self._pkg.MoE("moe", 1.0, *shape[:6], self._pkg.MoEQuantMode[mode], distribution, 1),
        )  # fmt: skip

    def deepep(
        self, num_tokens: int, phase: str, low_latency: bool, hidden_size: int, top_k: int, num_experts: int,
        ep: int, num_nodes: int,
    ) -> KernelTime | None:  # fmt: skip
        """DeepEP's `phase` (dispatch or combine) of one MoE layer for `num_tokens` tokens a rank over
        `ep` ranks on `num_nodes` nodes: its low-latency kernels (decode) or its high-throughput ones
        (prefill, on DeepEP's default 20 SMs)."""
        backend = "deepep_ll" if low_latency else "deepep_ht"
        shape = (hidden_size, top_k, num_experts, ep, num_nodes)
        return self._lookup(
            ("deepep", phase, backend, *shape), dict(x=num_tokens),
            lambda: self._pkg.MoEAllToAll(
                "deepep", 1.0, phase=phase, comm_dtype="default", comm_backend=backend,
                hidden_size=hidden_size, topk=top_k, num_experts=num_experts, moe_ep_size=ep,
                node_num=num_nodes, sms=0 if low_latency else 20, attention_tp_size=1,
            ),
            is_context=not low_latency,
        )  # fmt: skip

    def elementwise(self, num_tokens: int, dim_in: int, dim_out: int) -> KernelTime | None:
        """A memory-bound element-wise kernel over `num_tokens` tokens, reading `dim_in` and writing
        `dim_out` BF16 elements a token (a fused residual add and RMSNorm, a gated activation). No table
        holds these: the package prices them from the GPU's memory bandwidth and a fixed latency a
        kernel (`measured` False)."""
        return self._lookup(
            ("elementwise", dim_in, dim_out), dict(x=num_tokens),
            lambda: self._pkg.ElementWise("elementwise", 1.0, dim_in, dim_out),
        )  # fmt: skip

    def _lookup(
        self, op_key: tuple[Any, ...], at: dict[str, int], make_op: Callable[[], Any], is_context: bool = True
    ) -> KernelTime | None:
        """The kernel `make_op()` builds (`op_key` names it) at the shape `at`, from the cache or the
        package's engine; None where the package has no data for it."""
        key = (*op_key, *at.values())  # each op_key's shapes are named in one order, at one call site
        try:
            return self._answers[key]
        except KeyError:
            pass
        answer: KernelTime | None
        try:
            [(_, ms, _, source)] = self._engine.evaluate_ops_json(
                self._pkg.build_ops_json([make_op()]),
                is_context=is_context,
                **{"batch_size": 1, "s": 1, **at},
            )
            answer = KernelTime(ms / 1000, source in MEASURED_SOURCES)
        except self._pkg.NO_DATA:
            answer = None
        self._answers[key] = answer
        return answer


@functools.cache
def tables_for(gpu: str, backend: str = "vllm", version: str = BACKEND_VERSION) -> KernelTables:
    """The kernel tables of the GPU named `gpu` (a name of `emulation.profiles.GPUS`), opened once a
    process (KernelTablesError: none)."""
    return KernelTables(TABLE_SYSTEMS.get(gpu, gpu), backend, version)


@functools.cache
def _package() -> SimpleNamespace:
    """What the lookups use of aiconfigurator-core, imported once (its Rust extension loads here)."""
    try:
        from aiconfigurator_core.sdk import common, perf_database
        from aiconfigurator_core.sdk.engine import EngineHandle, build_ops_json
        from aiconfigurator_core.sdk.errors import MissingSystemFlopsError, PerfDataNotAvailableError
        from aiconfigurator_core.sdk.operations.attention import ContextAttention, GenerationAttention
        from aiconfigurator_core.sdk.operations.communication import CustomAllReduce
        from aiconfigurator_core.sdk.operations.elementwise import ElementWise
        from aiconfigurator_core.sdk.operations.gemm import GEMM
        from aiconfigurator_core.sdk.operations.mamba import GDNKernel
        from aiconfigurator_core.sdk.operations.mla import ContextMLA, GenerationMLA, MLABmm, MLAModule
        from aiconfigurator_core.sdk.operations.moe import MoE
        from aiconfigurator_core.sdk.operations.moe_comm import MoEAllToAll
    except ImportError:
        raise KernelTablesError(missing_package_line()) from None
    return SimpleNamespace(
        perf_database=perf_database, EngineHandle=EngineHandle, build_ops_json=build_ops_json,
        GEMM=GEMM, ContextAttention=ContextAttention, GenerationAttention=GenerationAttention,
        CustomAllReduce=CustomAllReduce, MoE=MoE, MLAModule=MLAModule, GDNKernel=GDNKernel,
        ContextMLA=ContextMLA, GenerationMLA=GenerationMLA, MLABmm=MLABmm, MoEAllToAll=MoEAllToAll,
        ElementWise=ElementWise,
        GEMMQuantMode=common.GEMMQuantMode, MoEQuantMode=common.MoEQuantMode,
        KVCacheQuantMode=common.KVCacheQuantMode, FMHAQuantMode=common.FMHAQuantMode,
        NO_DATA=(MissingSystemFlopsError, PerfDataNotAvailableError),
    )  # fmt: skip
