"""The offered load of a run's workload, one number whatever its kind: a synthetic workload's arrival
rate (req/s), a conversation scenario's start rate (conversations/s), a trace's speedup. What a sweep's
`--rates` and a plan's `--loads` set."""

from __future__ import annotations

from dataclasses import replace

from emulation.config import TestbedConfig


def load_key(cfg: TestbedConfig) -> str:
    """The field that sets the offered load: a trace's speedup, a conversation scenario's start rate,
    else the arrival rate."""
    kind = cfg.workload.kind
    return {"trace": "replay.speedup", "multi_turn": "multi_turn.conversation_rate"}.get(
        kind, "workload.rate"
    )


def with_load(cfg: TestbedConfig, load: float, seed: int) -> TestbedConfig:
    """`cfg` at `load` (in `load_key`'s field) and `seed`."""
    kind = cfg.workload.kind
    if kind == "trace":
        return replace(cfg, replay=replace(cfg.replay, speedup=load), seed=seed)
    if kind == "multi_turn":
        return replace(cfg, multi_turn=replace(cfg.multi_turn, conversation_rate=load), seed=seed)
    return replace(cfg, workload=replace(cfg.workload, rate=load), seed=seed)


def closed_loop_refusal(cfg: TestbedConfig, command: str) -> str | None:
    """Why `testbed <command>` (a sweep or a plan: they vary the arrival rate) cannot load `cfg`, in one
    line; None if it can. A closed loop (`workload.max_concurrency`) has no arrival rate to vary."""
    if cfg.workload.kind != "synthetic" or cfg.workload.max_concurrency is None:
        return None
    return (
        f"workload.max_concurrency={cfg.workload.max_concurrency}: testbed {command} varies the arrival "
        "rate, and a closed loop has none; allowed: unset, or one testbed run per concurrency "
        "(--set workload.max_concurrency=N)"
    )
