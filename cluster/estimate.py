"""How long a run will take on this host, said before it starts when that is more than a moment.

Two costs dominate: real compute (every prompt token through the runner model) and, in live mode,
the emulated span itself (`wall = sim x time_scale`). Think times of a closed-loop trace lengthen the
span: a session's next turn waits for its think time after the previous answer.
"""

from __future__ import annotations

from emulation.config import TestbedConfig
from workloads.replay import LoadedWorkload
from workloads.traces.session import Trace

RUNNER_PREFILL_TOKENS_PER_WALL_S = 26_000.0
"""The default runner model's prefill speed on one thread of this 2-core machine: an 8,192-token prompt
in ~315 ms (`bench/runner_speed.py`); a lower bound on real compute's cost (decode steps add to it)."""
SAY_ABOVE_WALL_S = 30.0
"""Estimates shorter than this are not printed."""


def estimate_line(
    configs: list[TestbedConfig], loaded: LoadedWorkload | None, num_parallel: int = 1
) -> str | None:
    """One line saying how long running every one of `configs` through `loaded` (None: each its own
    synthetic workload), `num_parallel` at a time, will take at least, and why; None when it is short."""
    sizes = [_size(cfg, loaded) for cfg in configs]
    total_s = 0.0
    for cfg, (prompt_tokens, span_s) in zip(configs, sizes, strict=True):
        if cfg.runner.compute == "real":
            total_s += prompt_tokens / RUNNER_PREFILL_TOKENS_PER_WALL_S
        if cfg.clock.mode == "live" and isinstance(cfg.clock.time_scale, float | int):
            total_s += span_s * cfg.clock.time_scale
    total_s /= max(1, min(num_parallel, len(configs)))
    if total_s < SAY_ABOVE_WALL_S:
        return None
    c = configs[0]
    prompt_tokens, span_s = sizes[0]
    parts: list[str] = []
    if c.runner.compute == "real":
        parts.append(
            f"{prompt_tokens:,} prompt tokens a design through the runner model at "
            f"~{RUNNER_PREFILL_TOKENS_PER_WALL_S:,.0f} tokens/s (--compute skip: the same emulated times, "
            "without real numerics)"
        )
    if c.clock.mode == "live":
        scales = ", ".join(f"{x.clock.time_scale:g}" for x in configs if x.clock.time_scale != "auto")
        parts.append(f"live: {span_s:,.0f} emulated s a design x time_scale {scales}")
    return f"estimate: at least {_duration(total_s)} wall for {len(configs)} design(s): " + "; ".join(parts)


def _size(cfg: TestbedConfig, loaded: LoadedWorkload | None) -> tuple[int, float]:
    """The prompt tokens a design computes (before prefix caching) and the emulated span of arrivals,
    with a closed-loop trace's longest chain of think times."""
    workload = loaded.workload if loaded is not None else None
    if not isinstance(workload, Trace):
        w = cfg.workload
        closed_loop = w.max_concurrency is not None  # sent as answers come: no span known (0 bounds it)
        return w.num_requests * w.prompt_len, 0.0 if closed_loop else w.num_requests / w.rate
    turns = [t for s in workload.all_sessions() for t in s.turns]
    times = [t.t_s for t in turns] or [0.0]
    thinks = [sum(t.think_s for t in s.turns) for s in workload.all_sessions()] or [0.0]
    span_s = (max(times) - min(times) + max(thinks)) / cfg.replay.speedup
    return sum(t.prompt.num_tokens for t in turns), span_s


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
