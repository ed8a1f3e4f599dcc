"""`time_scale: auto`: the smallest scale at which this host's real work fits every step's budget.

A step must finish its real work and wake up within its emulated time × time_scale::

    time_scale >= (real_s + wake_allowance_s) / emulated_s      for every probe step, × headroom

Probes are the steps that cost the host most relative to the target: with real compute, the
longest-context prefill chunk, a decode batch at full context, and both in one step; with compute skip,
only the engine's own bookkeeping against the shortest step. In P/D, a prompt's KV handoff is a probe
too: reading it out of one pool and into another, plus an actor round trip, against the emulated
transfer. Measured in one process with the runner's thread count: here, or, on a Ray cluster the run
joins, on every node that can host one of its engines (the driver's host may have no GPU, or another
CPU), the largest scale kept.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from actors.engine.kv_connectors.transfer import KVReceiver
from emulation.config import TestbedConfig
from emulation.kv_cache import cdiv
from emulation.profiles import LINKS
from emulation.step_shape import StepItem, StepShape
from emulation.time_model import time_model_for
from messages import KVTransferParams

WAKE_ALLOWANCE_WALL_S = 0.005
"""p99 overshoot of a short sleep with both cores busy on a 2-core host (DESIGN.md)."""
HEADROOM = 1.25
BOOKKEEPING_WALL_S = 0.0005
"""Scheduler, roofline and stream work of one step, generously (virtual runs measure ~60 µs)."""
DECODE_PROBE_BATCH = 8
ACTOR_CALL_WALL_S = 0.020
"""The get_kv round trip carrying a prompt's KV between busy actors (measured here: up to ~20 ms)."""
MIN_AUTO_SCALE = 1.0
"""`auto` never runs faster than real time. Probes run alone in one process; a live run shares the cores
with its other engines, the proxy and Ray's daemons, and stalls of tens of ms (GC, scheduling) do not
shrink with the scale. Measured here with 2k prompts: `auto` picked 0.6-0.75 from the probes, and the
runs lagged 0.9-1.8 % (prefill steps 60 ms over a 110 ms budget); at 1 they fit."""


def _probes(cfg: TestbedConfig) -> dict[str, list[tuple[int, int, bool]]]:
    """name -> [(num_new_tokens, num_context_tokens, needs_logits)] of one representative step."""
    w, s = cfg.workload, cfg.scheduler
    chunk = min(s.max_num_batched_tokens, w.prompt_len)
    chunk_ctx = w.prompt_len - chunk
    decodes = [(1, w.prompt_len, True)] * min(DECODE_PROBE_BATCH, s.max_num_seqs)
    return {
        "prefill chunk": [(chunk, chunk_ctx, True)],
        "decode batch": decodes,
        "mixed step": [*decodes, (max(1, chunk - len(decodes)), chunk_ctx, False)],
        "short decode": [(1, 1, True)],
    }


def _measure(cfg: TestbedConfig, step: list[tuple[int, int, bool]]) -> float:
    """Real seconds of the runner's forward pass for `step` (the slowest of 3 after a warm-up that builds the
    requests' working KV, as a running engine has it); contexts are zeros."""

    from actors.engine.runner.model_runner import ModelRunner, RunnerInput
    from actors.engine.runner.tiny_model import load_model

    bs = cfg.scheduler.block_size
    need = sum(cdiv(n + c, bs) for n, c, _ in step)
    runner = ModelRunner(
        load_model(cfg.runner), num_blocks=need, block_size=bs, num_threads=cfg.runner.num_threads
    )
    items, first = [], 0
    for i, (n, c, logits) in enumerate(step):
        blocks = list(range(first, first + cdiv(n + c, bs)))
        first += len(blocks)
        items.append(RunnerInput(f"probe-{i}", [1] * n, c, blocks, n + c, logits))
    runner.execute(items)
    times = []
    for _ in range(3):
        t = time.perf_counter()
        runner.execute(items)  # recomputes the same positions: same cost as the step it stands for
        times.append(time.perf_counter() - t)
    return max(times)  # the slowest of three: a budget must hold for the unlucky step too


def _measure_handoff(cfg: TestbedConfig, num_tokens: int) -> float:
    """Real seconds to read a prompt's KV out of one runner's pool and write it into another's."""
    from actors.engine.runner.model_runner import ModelRunner
    from actors.engine.runner.tiny_model import load_model

    bs = cfg.scheduler.block_size
    blocks = list(range(cdiv(num_tokens, bs)))
    model = load_model(cfg.runner)
    src, dst = (
        ModelRunner(model, num_blocks=len(blocks), block_size=bs, num_threads=cfg.runner.num_threads)
        for _ in range(2)
    )
    times = []
    for _ in range(3):
        t = time.perf_counter()
        dst.write_kv(blocks, src.read_kv(blocks, num_tokens))
        times.append(time.perf_counter() - t)
    return max(times)  # the slowest of three: a budget must hold for the unlucky step too


def _handoff_probe(cfg: TestbedConfig) -> tuple[float, float] | None:
    """(real, emulated) seconds of one prompt's handoff in P/D, None when collocated."""
    if not cfg.pools.prefill.replicas:
        return None
    n, bs, pools = cfg.workload.prompt_len, cfg.scheduler.block_size, cfg.pools
    link, model = LINKS[cfg.kv_transfer.link], cfg.target.profile
    receiver = KVReceiver(
        cfg.kv_transfer,
        link=link,
        model=model,
        block_size=bs,
        tp=pools.decode.attention_tp,
        peer_tp=pools.prefill.attention_tp,
    )
    params = KVTransferParams(remote_block_ids=tuple(range(cdiv(n, bs))))
    emulated = receiver.plan(params, 0.0, 0).time
    real = ACTOR_CALL_WALL_S + (_measure_handoff(cfg, n) if cfg.runner.compute == "real" else 0.0)
    return real, emulated.total_s


def calibrate(cfg: TestbedConfig) -> tuple[float, dict[str, Any]]:
    """The smallest safe time_scale for `cfg` on this host (at least MIN_AUTO_SCALE), with the probe
    figures behind it (each probe's own `scale`)."""
    step_time = time_model_for(cfg, next(p for _, p in cfg.pools.by_role() if p.replicas)).step_time_of
    details: dict[str, Any] = {}
    scale = 0.0
    for name, step in _probes(cfg).items():
        emulated = step_time(StepShape.of(StepItem(n, c, lg) for n, c, lg in step)).total_s
        real = BOOKKEEPING_WALL_S + (_measure(cfg, step) if cfg.runner.compute == "real" else 0.0)
        need = (real + WAKE_ALLOWANCE_WALL_S) / emulated * HEADROOM
        details[name] = {
            "real_ms": round(real * 1e3, 2),
            "emulated_ms": round(emulated * 1e3, 2),
            "scale": round(need, 3),
        }
        scale = max(scale, need)
    handoff = _handoff_probe(cfg)
    if handoff is not None:
        real, emulated = handoff
        need = real / emulated * HEADROOM  # the real move has no sleep to wake from
        details["kv handoff"] = {
            "real_ms": round(real * 1e3, 2),
            "emulated_ms": round(emulated * 1e3, 2),
            "scale": round(need, 3),
        }
        scale = max(scale, need)
    return max(MIN_AUTO_SCALE, math.ceil(scale * 20) / 20), details


def calibrate_on_engine_nodes(cfg: TestbedConfig) -> tuple[float, dict[str, dict[str, Any]]]:
    """`calibrate` on every node of the joined Ray cluster that offers a resource of `cfg`'s pools, all at
    once (the nodes are separate hosts); the largest scale, and each node's (by id): its address, scale
    and probes. No such node: calibrated here (placing the engines fails later, naming the pool)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    roles = [role for role, pool in cfg.pools.by_role() if pool.replicas]
    nodes = [n for n in ray.nodes() if n["Alive"] and any(n["Resources"].get(r, 0) > 0 for r in roles)]
    if not nodes:
        return calibrate(cfg)[0], {}
    task = ray.remote(num_cpus=0)(calibrate)
    pinned = [NodeAffinitySchedulingStrategy(n["NodeID"], soft=False) for n in nodes]
    found = ray.get([task.options(scheduling_strategy=on).remote(cfg) for on in pinned])
    per_node = {
        n["NodeID"]: {"address": n["NodeManagerAddress"], "scale": scale, "probes": probes}
        for n, (scale, probes) in zip(nodes, found, strict=True)
    }
    return max(scale for scale, _ in found), per_node


def resolve_time_scale(cfg: TestbedConfig, address: str | None = None) -> TestbedConfig:
    """`cfg` with `clock.time_scale: auto` replaced by its calibrated value (unchanged otherwise): here,
    or, joining the Ray cluster at `address`, on the nodes its engines can run on."""
    if cfg.clock.time_scale != "auto":
        return cfg
    if address:
        from cluster.ray_connect import connect

        connect([cfg], address)  # joined (never started here): the run's own connect keeps it
        scale, _ = calibrate_on_engine_nodes(cfg)
    else:
        scale, _ = calibrate(cfg)
    return dataclasses.replace(cfg, clock=dataclasses.replace(cfg.clock, time_scale=scale))
