"""The time model of a config that names none: `measured` wherever every LM pool's GPU has kernel
tables, else `aggregate`; and under `measured`, its own CPU time a step where none is set. Both are
resolved once at the configuration edge so that every run's written config shows what was used.

Why `measured`: on the 2,711 held-out public silicon rows it has the lower median TTFT and TPOT errors
of the testbed's time models (52 % and 16 %, against 64 % and 24 % per operator and 76 % and 36 % in
aggregate; docs/validation.md), with one constant fitted, on the rows' calibration fifth (its CPU time
a step, `MEASURED_S_PER_STEP`). Where a pool's GPU has no tables (H800, Ascend 910C) the whole config
keeps `aggregate`, the model its figures were always given on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from cluster.config_rules_hybrid import engine_pools
from emulation.config import KernelTablesConfig, PoolConfig, TestbedConfig
from emulation.config.model import MEASURED_S_PER_STEP
from emulation.kernel_tables import KernelTablesError, tables_for
from emulation.profiles import GPUS


def resolve_time_model(cfg: TestbedConfig, *, configured: bool) -> TestbedConfig:
    """`cfg` with `target.time_model` measured where it is not `configured` and every LM pool's GPU has
    `target.kernel_tables`; `cfg` as it is otherwise (an unknown GPU: a rule names it)."""
    pools = engine_pools(cfg)
    if configured or not pools or any(pool.gpu not in GPUS for _, pool in pools):
        return cfg
    if first_without_tables(cfg.target.kernel_tables, pools) is not None:
        return cfg
    return dataclasses.replace(cfg, target=dataclasses.replace(cfg.target, time_model="measured"))


def resolve_cpu_overhead(cfg: TestbedConfig, *, configured: bool) -> TestbedConfig:
    """`cfg` with the measured model's own CPU time a step (`MEASURED_S_PER_STEP`) where its time model
    is `measured` and `target.cpu_overhead.s_per_step` is not `configured`."""
    t = cfg.target
    if configured or t.time_model != "measured":
        return cfg
    cpu = dataclasses.replace(t.cpu_overhead, s_per_step=MEASURED_S_PER_STEP)
    return dataclasses.replace(cfg, target=dataclasses.replace(t, cpu_overhead=cpu))


def first_without_tables(
    k: KernelTablesConfig, pools: Iterable[tuple[str, PoolConfig]]
) -> tuple[str, PoolConfig, KernelTablesError] | None:
    """The first of `pools` (name, pool) whose GPU has no `k` tables, with why; None: all have them."""
    for name, pool in pools:
        try:
            tables_for(pool.gpu, k.backend, k.version)
        except KernelTablesError as e:
            return name, pool, e
    return None
