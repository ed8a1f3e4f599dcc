"""Aggregate roofline step time of the emulated target (`target.time_model: aggregate`): a pure
function of the batch.

One engine step runs the scheduled tokens of several requests in one forward pass, taken as one
roofline over the whole batch::

    flops = 2·P_layers·new_tokens + attention(new_tokens, context) + 2·P_head·num_logits
    bytes = step weights + KV read (context tokens of every scheduled request)
    t     = max(flops / (peak·η_c), bytes / (bw·η_b)) + overhead

The KV the new tokens write (new_tokens · KV bytes per token) is not priced; it is the step's
`write_bytes`, beside `flops` and `bytes` (read) the figures vLLM's MFU estimate exports per GPU.

Attention over `keys attended` (`emulation.step_shape`), 2 FLOPs per MAC for QK^T and again for PV::

    flops = 4 · num_heads · head_dim · num_layers · keys attended

Tensor parallelism multiplies peak compute and bandwidth by `tp`; its all-reduces are not modelled
(the per-operator model, `emulation.operators`, has them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from emulation.config import PoolConfig, TestbedConfig
from emulation.profiles import GPUS, MODELS, GpuProfile, ModelProfile
from emulation.step_shape import StepItem, StepShape


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

    @property
    def total_s(self) -> float:
        return maximum(self.compute_s, self.memory_s) + self.overhead_s

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
) -> StepTime:
    """The roofline of `flops` and `nbytes` (read) on `tp` GPUs at the fitted efficiencies;
    `write_bytes` is carried along, not priced."""
    compute_s = flops / (gpu.peak_tflops * 1e12 * tp * eta_compute)
    memory_s = nbytes / (gpu.memory_bw_gbs * 1e9 * tp * eta_bandwidth)
    return StepTime(flops, nbytes, compute_s, memory_s, overhead_s, tp, write_bytes)


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
        return self.step_time_of(StepShape.of(items))

    def step_time_of(self, shape: StepShape) -> StepTime:
        """The time of a step of `shape` (the engine's entry: the scheduler builds the shape)."""
        m = self.model
        if shape.num_new_tokens == 0:
            return StepTime(0.0, 0.0, 0.0, 0.0, self.overhead_s, self.tp)
        flops = (
            2.0 * m.num_layer_params * shape.num_new_tokens
            + 4.0 * m.num_heads * m.head_dim * m.num_layers * shape.keys_attended
            + 2.0 * m.num_head_params * shape.num_logits
        )
        nbytes = 1.0 * (m.step_weight_bytes + shape.num_context_tokens * m.kv_bytes_per_token)  # float(s)
        # as the operator model counts it: KV heads replicated where tp exceeds them
        written = 1.0 * shape.num_new_tokens * m.kv_bytes_per_token_per_gpu(self.tp) * self.tp
        t, e_c, e_b = self.tp, self.eta_compute, self.eta_bandwidth
        return timed(flops, nbytes, self.gpu, t, e_c, e_b, self.overhead_s, written)


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
