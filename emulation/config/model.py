"""The emulated target: its model and how its steps' time is modelled."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from emulation.config.moe import EpFabricConfig, MoeRoutingConfig
from emulation.config.strict import STRICT
from emulation.hf_config import ModelConfigError, is_config_source
from emulation.profiles import MODELS, ModelProfile, base_profile, target_model


@dataclass(frozen=True)
class OperatorEfficiencies:
    """Fractions of peak each operator group achieves (`target.time_model: operators`). Defaults: the
    aggregate model's two, fitted to the guide's L40S low-load medians (compute: the 8k prompt's TTFT;
    bandwidth: the ITL), given to the groups they bound; nothing else is fitted."""

    __pydantic_config__ = STRICT

    gemm_compute: Annotated[float, Field(gt=0, le=1)] = 0.47
    """QKV/O and MLP GEMMs and the LM head, of peak FLOP/s (compute-bound: prompt chunks)."""
    attention_compute: Annotated[float, Field(gt=0, le=1)] = 0.47
    """Prefill attention (FlashAttention-style, causal), of peak FLOP/s."""
    weights_bandwidth: Annotated[float, Field(gt=0, le=1)] = 0.75
    """Streaming the weights (memory-bound GEMMs: decode batches), of peak memory bandwidth."""
    kv_bandwidth: Annotated[float, Field(gt=0, le=1)] = 0.75
    """Decode attention reading each decode's KV, of peak memory bandwidth."""
    all_reduce_bandwidth: Annotated[float, Field(gt=0, le=1)] = 0.8
    """Tensor-parallel all-reduces, of the TP link's bandwidth (an assumed bus efficiency: measure)."""


MEASURED_S_PER_STEP = 8e-4
"""`cpu_overhead.s_per_step` under `measured`, calibrated on the public silicon rows' calibration fifth
(rows whose id's sha256 is 0 mod 5; 627 rows, H100 to GB300, vLLM, SGLang, TRT-LLM): the value at which
their median signed TPOT error is 0 (at 2 ms: +10 %; at 0.8 ms: -0.1 %, median absolute error 19.0 ->
16.6 %; TTFT's 50.5 -> 52.0 %, its prefill steps shorter too). The guide's 2 ms was the aggregate
model's fit on an L40S, where it also stood in for the kernels that model lacks (the measured model
prices them, element-wise ones included); on these engines the CPU prepares the next step while the GPU
runs this one (vLLM's async scheduling, SGLang's and TRT-LLM's overlap schedulers), so less of it lies
on the step's path."""


@dataclass(frozen=True)
class CpuOverhead:
    """CPU work on a step's path (`target.time_model: operators`): scheduling, preparing inputs,
    sampling, output processing, detokenising and streaming, which grow with the batch."""

    __pydantic_config__ = STRICT

    s_per_step: Annotated[float, Field(ge=0)] = 0.002
    """Fixed per step: the aggregate model's step overhead, fitted to the guide's low-load ITL (one or
    two running requests). Unset under `measured`: `MEASURED_S_PER_STEP` (resolved at load)."""
    s_per_request: Annotated[float, Field(ge=0)] = 1.4e-5
    """Per running (scheduled) request: vLLM V1 measured a 5-6 ms gap between decode steps at 256
    running requests (Llama-2-7B; vllm-project/vllm#10634), (5.5 ms - 2 ms) / 256."""
    s_per_token: Annotated[float, Field(ge=0)] = 0.0
    """Per scheduled token (input arrays, slot mapping) on the step's critical path: none by default.
    That work is vectorised and runs while the GPU finishes the previous step: an engine with vLLM-like
    batching measured 0.95 ms for a 16,255-token prefill (58 ns a token), 98.5 % of it under GPU work
    (wejoncy/sfllm#43); vLLM V1 prepares inputs the same way (numpy arrays, async scheduling). Set it
    when a profile of your server shows gaps between steps growing with the batch's tokens."""


@dataclass(frozen=True)
class KernelTablesConfig:
    """Which measured kernel tables price the steps (`target.time_model: measured`): aiconfigurator-core's,
    per GPU and serving backend (`emulation.kernel_tables`)."""

    __pydantic_config__ = STRICT

    backend: Literal["vllm", "sglang", "trtllm"] = "vllm"
    """The serving engine whose kernels were measured."""
    version: Annotated[str, Field(min_length=1)] = "current"
    """The tables' version: the package's `current` slot (its newest measured release for the GPU),
    `next`, or a slot's version number (e.g. 0.24.0)."""


def _check_model(model: str) -> str:
    """A built-in name, or a config that reads (a path, a shipped Hugging Face id)."""
    if model in MODELS:
        return model
    if not is_config_source(model):
        raise ValueError(
            f"unknown model; allowed: {', '.join(MODELS)}, a path to a config.json or its directory, or a "
            "Hugging Face id whose config ships with aiconfigurator-core (e.g. deepseek-ai/DeepSeek-R1)"
        )
    try:
        base_profile(model)
    except ModelConfigError as e:
        raise ValueError(str(e)) from None
    return model


WeightFormatSetting = Literal["auto", "bf16", "fp8", "fp8_block", "nvfp4", "mxfp4", "int4_wo"]


@dataclass(frozen=True)
class QuantizationConfig:
    """How the target stores its weights and KV cache (vLLM's --quantization and --kv-cache-dtype), in
    emulation.quantization's formats: each sets the bytes stored and the tensor cores its GEMMs run
    on (a format the GPU has no tensor cores for runs weight-only, at the BF16 peak, as vLLM runs it)."""

    __pydantic_config__ = STRICT

    weights: WeightFormatSetting = "auto"
    """The decoder layers' weights (attention, dense MLPs, shared experts, SSM projections); auto: as
    the checkpoint stores them (its config's quantization block; a built-in profile's own)."""
    experts: WeightFormatSetting = "auto"
    """The routed experts' weights; auto: the checkpoint's, or as `weights` when that is set."""
    kv_cache: Literal["auto", "bf16", "fp8"] = "auto"
    """KV cache elements: bf16 (2 bytes) or fp8 (1: half the KV bytes a token, so twice the tokens
    cached, and half the bytes a P/D handoff or an offload moves); auto: the checkpoint's
    (kv_cache_quant_algo FP8: fp8), else bf16."""


@dataclass(frozen=True)
class TargetConfig:
    __pydantic_config__ = STRICT

    model: Annotated[str, AfterValidator(_check_model)] = "qwen2.5-7b"
    """Emulated model: a name from emulation.profiles.MODELS, a path to a Hugging Face config.json or
    its directory, or a Hugging Face id whose config ships with aiconfigurator-core
    (emulation.hf_config; nothing is downloaded)."""
    quantization: QuantizationConfig = field(default_factory=QuantizationConfig)
    """How weights and KV cache are stored (auto: as the checkpoint)."""
    served_model_name: str | None = None
    """The `model_name` label of every metric (vLLM's --served-model-name); None: `model`."""
    eta_compute: Annotated[float, Field(gt=0, le=1)] = 0.47
    """Fraction of peak FLOP/s a step achieves (fitted to the guide's L40S medians)."""
    eta_bandwidth: Annotated[float, Field(gt=0, le=1)] = 0.75
    """Fraction of peak memory bandwidth a step achieves."""
    step_overhead_s: Annotated[float, Field(ge=0)] = 0.002
    """Fixed per-step cost: scheduling, launch, sampling (the aggregate model's)."""
    time_model: Literal["aggregate", "operators", "measured"] = "aggregate"
    """aggregate: one roofline over the whole step, max(compute, memory) + step_overhead_s (eta_compute,
    eta_bandwidth); operators: a roofline per operator group, summed, with tensor-parallel all-reduces
    and a CPU overhead that grows with the batch (`operators`, `cpu_overhead`; emulation.operators);
    measured: the operators model's groups priced from kernels measured on the pool's GPU
    (`kernel_tables`; emulation.measured), the roofline where the tables lack a kernel. Unset: measured
    where every LM pool's GPU has tables, else aggregate (`cluster.time_model_default`)."""
    operators: OperatorEfficiencies = field(default_factory=OperatorEfficiencies)
    """The per-operator model's efficiencies (the measured model's, where it falls back)."""
    kernel_tables: KernelTablesConfig = field(default_factory=KernelTablesConfig)
    """The measured model's tables."""
    measured_fallback: Literal["refuse", "roofline"] = "refuse"
    """measured, on a GPU with no tables (H800, Ascend 910C): refuse the config, or run that pool's steps
    on the operators roofline (its measured share then 0 %)."""
    cpu_overhead: CpuOverhead = field(default_factory=CpuOverhead)
    """The per-operator model's CPU work per step."""
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    """Share of GPU memory the engine may use for weights + KV (vLLM's flag)."""
    moe_routing: MoeRoutingConfig = field(default_factory=MoeRoutingConfig)
    """Mixture-of-experts targets: which experts the tokens reach (the time model's expected loads)."""
    ep_fabric: EpFabricConfig = field(default_factory=EpFabricConfig)
    """Mixture-of-experts targets: the network expert-parallel all-to-alls cross."""
    mamba_ssm_cache_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Hybrid targets: the dtype of the SSM layers' recurrent state (vLLM's --mamba-ssm-cache-dtype);
    auto: the model's default (Nemotron-H float32, the others bfloat16). It sizes every state page,
    handoff and decode's state traffic."""

    @property
    def profile(self) -> ModelProfile:
        """The emulated model's profile, its state dtype applied: what every reader of the target uses."""
        q = self.quantization
        return target_model(self.model, self.mamba_ssm_cache_dtype, q.weights, q.experts, q.kv_cache)
