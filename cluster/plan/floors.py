"""Latency floors: what a candidate's requests take with the engines to themselves (no queue, no
batch-mates), from the same step-time model the replay prices steps with. No load lowers them, so a
target below a floor is out of reach at every load: such candidates are dropped before any replay,
and a target that no candidate meets is explained by the floor it sits under.

    ttft  the prompt's chunks one after another (each max_num_batched_tokens, or
          long_prefill_token_threshold, attending to the chunks before it) on the prefill pool
          (collocated: the mixed pool); the handoff and the render are not counted
    tpot, itl, gap  one decode step, batch of one, at the prompt's length, on the decode pool
    e2el  ttft + (output - 1) x that step

Only synthetic workloads have floors known before a replay (every prompt is `prompt_len` tokens and
none is cached); a trace's or conversation's depend on its prefix hits: None.
"""

from __future__ import annotations

from emulation.config import TestbedConfig
from emulation.config.engines import PoolConfig
from emulation.step_shape import StepShape
from emulation.time_model import time_model_for


def prefill_floor_s(cfg: TestbedConfig, pool: PoolConfig, num_tokens: int, num_cached: int = 0) -> float:
    """Seconds to compute a prompt's `num_tokens - num_cached` tokens alone, chunk by chunk."""
    model = time_model_for(cfg, pool)
    s = cfg.scheduler
    chunk = min(s.max_num_batched_tokens, s.long_prefill_token_threshold or s.max_num_batched_tokens)
    total, done = 0.0, num_cached
    while done < num_tokens:
        n = min(chunk, num_tokens - done)
        shape = StepShape()
        shape.add(n, done, done + n == num_tokens)
        total += model.step_time_of(shape).total_s
        done += n
    return total


def decode_floor_s(cfg: TestbedConfig, pool: PoolConfig, context: int) -> float:
    """Seconds of one decode step with one request attending to `context` tokens."""
    shape = StepShape()
    shape.add(1, context, True)
    return time_model_for(cfg, pool).step_time_of(shape).total_s


def floors_s(cfg: TestbedConfig) -> dict[str, float] | None:
    """Each metric's floor for a synthetic workload's requests; None for other workloads."""
    w = cfg.workload
    if w.kind != "synthetic":
        return None
    pools = cfg.pools
    first, second = (pools.prefill, pools.decode) if pools.prefill.replicas else (pools.mixed, pools.mixed)
    ttft = prefill_floor_s(cfg, first, w.prompt_len)
    step = decode_floor_s(cfg, second, w.prompt_len)
    floors = {"ttft": ttft, "e2el": ttft + (w.output_len - 1) * step}
    if w.output_len > 1:  # one-token answers have no gaps to bound
        floors.update(tpot=step, itl=step, gap=step)
    return floors
