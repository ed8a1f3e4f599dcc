"""Roofline step time of the emulated target: a pure function of the batch.

One engine step runs the scheduled tokens of several requests in one forward pass::

    flops = 2·P_layers·new_tokens + attention(new_tokens, context) + 2·P_head·num_logits
    bytes = step weights + KV read (context tokens of every scheduled request)
    t     = max(flops / (peak·η_c), bytes / (bw·η_b)) + overhead

Attention for a request with `c` tokens already in the cache and `n` new ones: new token i (position
c+i, 0-based) attends to c+i+1 keys, with 2 FLOPs per MAC for QK^T and again for PV::

    keys attended = Σ_{i=0}^{n-1} (c+i+1) = n·c + n(n+1)/2
    flops         = 4 · num_heads · head_dim · num_layers · keys attended

Tensor parallelism multiplies peak compute and bandwidth by `tp`; its all-reduce cost is not modelled.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from target.config import PoolConfig, TestbedConfig
from target.profiles import GPUS, MODELS, GpuProfile, ModelProfile


def keys_attended(num_new_tokens: int, num_context_tokens: int) -> int:
    """Keys the new tokens of one request attend to, with `num_context_tokens` already cached:
    Σ_{i=0}^{n-1} (c+i+1) = n·c + n(n+1)/2 (see the module's docstring)."""
    n = num_new_tokens
    return n * num_context_tokens + n * (n + 1) // 2


@dataclass(frozen=True)
class StepItem:
    """One request's share of a step."""

    num_new_tokens: int
    num_context_tokens: int
    """Tokens already in the KV cache before this step (num_computed_tokens)."""
    needs_logits: bool


@dataclass(frozen=True)
class StepTime:
    """Itemised roofline time of one step, in emulated seconds."""

    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.overhead_s

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
) -> StepTime:
    """The roofline of `flops` and `nbytes` on `tp` GPUs at the fitted efficiencies."""
    compute_s = flops / (gpu.peak_tflops * 1e12 * tp * eta_compute)
    memory_s = nbytes / (gpu.memory_bw_gbs * 1e9 * tp * eta_bandwidth)
    return StepTime(flops, nbytes, compute_s, memory_s, overhead_s)


@dataclass(frozen=True)
class Roofline:
    """The time model of one engine replica: a target model on `tp` GPUs with fitted efficiencies."""

    model: ModelProfile
    gpu: GpuProfile
    tp: int = 1
    eta_compute: float = 1.0
    eta_bandwidth: float = 1.0
    overhead_s: float = 0.0

    def step_time(self, items: Iterable[StepItem]) -> StepTime:
        num_new = 0
        keys = 0
        num_logits = 0
        num_context = 0
        for it in items:
            num_new += it.num_new_tokens
            keys += keys_attended(it.num_new_tokens, it.num_context_tokens)
            num_logits += it.needs_logits
            num_context += it.num_context_tokens
        return self.step_time_totals(num_new, keys, num_logits, num_context)

    def step_time_totals(
        self, num_new_tokens: int, keys_attended: int, num_logits: int, num_context_tokens: int
    ) -> StepTime:
        """The same time from batch totals (the engine accumulates them without building items)."""
        m = self.model
        if num_new_tokens == 0:
            return StepTime(0.0, 0.0, 0.0, 0.0, self.overhead_s)
        flops = (
            2.0 * m.num_layer_params * num_new_tokens
            + 4.0 * m.num_heads * m.head_dim * m.num_layers * keys_attended
            + 2.0 * m.num_head_params * num_logits
        )
        nbytes = float(m.step_weight_bytes + num_context_tokens * m.kv_bytes_per_token)
        return timed(flops, nbytes, self.gpu, self.tp, self.eta_compute, self.eta_bandwidth, self.overhead_s)

    def kv_capacity_tokens(self, gpu_memory_utilization: float) -> int:
        """Tokens of KV that fit beside the weights, as vLLM sizes its cache (activations not reserved)."""
        usable = self.gpu.memory_gb * 1e9 * self.tp * gpu_memory_utilization - self.model.weight_bytes
        return max(0, int(usable // self.model.kv_bytes_per_token))


def roofline_for(cfg: TestbedConfig, pool: PoolConfig) -> Roofline:
    """The fitted time model of one replica of `pool` under `cfg`'s target."""
    t = cfg.target
    return Roofline(
        MODELS[t.model],
        GPUS[pool.gpu],
        tp=pool.tp,
        eta_compute=t.eta_compute,
        eta_bandwidth=t.eta_bandwidth,
        overhead_s=t.step_overhead_s,
    )
