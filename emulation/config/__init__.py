"""The run configuration: frozen dataclasses, one per concern.

Built only through `cluster.config_load` (which validates YAML, presets and `--set` overrides at the
edge); everything inside the testbed takes these objects as given.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from emulation.config.afd import AfdConfig
from emulation.config.engines import PoolConfig, PoolsConfig, RunnerConfig, SchedulerConfig, replica_id
from emulation.config.faults import EngineFault, FaultsConfig, LinkSlowdown
from emulation.config.model import (
    CpuOverhead,
    KernelTablesConfig,
    OperatorEfficiencies,
    QuantizationConfig,
    TargetConfig,
)
from emulation.config.moe import EpFabricConfig, MoeRoutingConfig
from emulation.config.offload import KVOffloadConfig
from emulation.config.serving import ClockConfig, MetricsConfig, RenderConfig, RouterConfig
from emulation.config.strict import STRICT
from emulation.config.transfer import ECTransferConfig, KVTransferConfig
from emulation.config.workload import MultiTurnConfig, ReplayConfig, WorkloadConfig

__all__ = [
    "AfdConfig",
    "ClockConfig",
    "CpuOverhead",
    "ECTransferConfig",
    "EngineFault",
    "EpFabricConfig",
    "FaultsConfig",
    "KVOffloadConfig",
    "KVTransferConfig",
    "KernelTablesConfig",
    "LinkSlowdown",
    "MetricsConfig",
    "MoeRoutingConfig",
    "MultiTurnConfig",
    "OperatorEfficiencies",
    "PoolConfig",
    "PoolsConfig",
    "QuantizationConfig",
    "RenderConfig",
    "ReplayConfig",
    "RouterConfig",
    "RunnerConfig",
    "SchedulerConfig",
    "TargetConfig",
    "TestbedConfig",
    "WorkloadConfig",
    "replica_id",
]


@dataclass(frozen=True)
class TestbedConfig:
    """One design under one workload: everything a run needs."""

    __pydantic_config__ = STRICT
    __test__ = False  # not a pytest class

    design: str = "default"
    """Name of the design (a preset's key), carried into results."""
    target: TargetConfig = field(default_factory=TargetConfig)
    pools: PoolsConfig = field(default_factory=PoolsConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_transfer: KVTransferConfig = field(default_factory=KVTransferConfig)
    kv_offload: KVOffloadConfig = field(default_factory=KVOffloadConfig)
    ec_transfer: ECTransferConfig = field(default_factory=ECTransferConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    clock: ClockConfig = field(default_factory=ClockConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    render: RenderConfig = field(default_factory=RenderConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    slos: tuple[str, ...] = ("ttft<=2s,tpot<=30ms", "ttft<=2s,gap<=100ms")
    """SLO sets: comma-joined `metric[:pNN]<=value` terms over ttft, tpot, itl (per-request p99), gap,
    e2el; no pNN: p90 (`workloads/slo.py`, the grammar `testbed plan --slo` takes)."""
    seed: int = 0
    """Seeds arrivals, prompts and forced answers."""

    def __post_init__(self) -> None:
        if self.runner.compute == "auto":  # resolved once, so every reader (and the dump) sees real or skip
            compute: Literal["real", "skip"] = "real" if self.workload.output_policy == "greedy" else "skip"
            object.__setattr__(self, "runner", replace(self.runner, compute=compute))
