"""The step-time model an engine runs on: the aggregate roofline, the per-operator one, or the
per-operator one priced from measured kernels (`target.time_model`), all pure functions of the step's
shape."""

from __future__ import annotations

from typing import Protocol

from emulation.afd_layout import AfdLayout
from emulation.config import PoolConfig, TestbedConfig
from emulation.kernel_tables import KernelTablesError, tables_for
from emulation.measured import MeasuredKernels
from emulation.moe import ExpertLoad
from emulation.operators import OperatorRoofline
from emulation.profiles import GPUS, LINKS
from emulation.roofline import experts_for, roofline_for
from emulation.step_shape import StepShape


class TimedStep(Protocol):
    @property
    def total_s(self) -> float: ...

    @property
    def overhead_s(self) -> float:
        """Of `total_s`, the CPU's (the fixed step overhead, or the per-operator model's CPU work)."""
        ...

    @property
    def flops_per_gpu(self) -> float:
        """The step's floating-point operations on each of its GPUs (vLLM's MFU estimate's figures:
        these three are what `vllm:estimated_*_per_gpu` count)."""
        ...

    @property
    def read_bytes_per_gpu(self) -> float:
        """Bytes each GPU reads (weights, KV; per operator, spilled activations too)."""
        ...

    @property
    def write_bytes_per_gpu(self) -> float:
        """Bytes each GPU writes: the KV of the step's new tokens."""
        ...

    @property
    def all_to_all_s(self) -> float:
        """Of `total_s` (before overlap), the MoE layers' dispatches and combines (0: none)."""
        ...

    @property
    def overlap_s(self) -> float:
        """What dual-batch overlap hid of `total_s` (0: none)."""
        ...

    @property
    def measured_s(self) -> float:
        """Of `total_s` less the CPU's, what kernels measured on silicon priced (0: all roofline;
        `emulation.measured`)."""
        ...

    @property
    def expert_load(self) -> ExpertLoad | None:
        """What the step asked of the experts (None: a dense target)."""
        ...


class StepTimeModel(Protocol):
    def step_time_of(self, shape: StepShape) -> TimedStep: ...


def time_model_for(cfg: TestbedConfig, pool: PoolConfig) -> StepTimeModel:
    """The step-time model of one replica of `pool` under `cfg`'s target (`measured` on a GPU without
    tables: the operators roofline where `measured_fallback` allows it, else KernelTablesError; an AFD
    pool's pipeline is priced by its rooflines)."""
    t = cfg.target
    if pool.afd is not None:
        return afd_layout_for(cfg, pool)
    if t.time_model == "aggregate":
        return roofline_for(cfg, pool)
    model, gpu, experts = t.profile, GPUS[pool.gpu], experts_for(cfg, pool)
    operators = OperatorRoofline(model, gpu, pool.attention_tp, t.operators, t.cpu_overhead, experts)
    if t.time_model == "operators":
        return operators
    try:
        tables = tables_for(pool.gpu, t.kernel_tables.backend, t.kernel_tables.version)
    except KernelTablesError:
        if t.measured_fallback == "roofline":
            return operators
        raise
    return MeasuredKernels(model, gpu, pool.attention_tp, t.operators, t.cpu_overhead, experts, tables=tables)


def afd_layout_for(cfg: TestbedConfig, pool: PoolConfig) -> AfdLayout:
    """The time model of one replica of `pool`, whose `afd` puts attention and experts apart."""
    t, afd = cfg.target, pool.afd
    assert afd is not None and afd.link is not None  # config_rules: an AFD pool names its link
    return AfdLayout(
        t.profile,
        GPUS[pool.gpu],
        GPUS[afd.ffn_gpu or pool.gpu],
        afd,
        LINKS[afd.link],
        pool.tp,
        t.operators,
        t.cpu_overhead,
        t.moe_routing,
        t.ep_fabric,
    )
