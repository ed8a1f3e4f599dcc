"""Benchmark: what attention-FFN disaggregation's real compute costs in live mode, against the emulated
step it stands for.

With `pools.<role>.afd` and real compute, the engine's runner sends every MoE layer's normed hidden states
to its FFN rank actors and waits for their output (`cluster/hosts/ffn.py`): one Ray round trip per layer
per step, all F ranks' calls in flight at once. This measures, on a local Ray and the tiny Qwen3-MoE
runner model (2 layers, hidden 64, 8 experts, top 2):

- one crossing: a layer's call to F FFN actors and back (`RemoteFfnRanks.forward`), against the same
  experts computed in process (`LocalFfnRanks`): the difference is Ray's cost (serialise, schedule,
  object store, wake-up), for a decode batch of 16 tokens and a prefill chunk of 512;
- one step: `ModelRunner.execute` of 16 decodes (context 2,000) or one 512-token chunk, collocated and
  with the FFN actors;
- the emulated DeepSeek-V3 step of the same shape on an AFD replica (`DSV3_AFD`: 16 attention ranks of
  one H800, one FFN rank of 32 H800s), and the time scale (wall seconds per emulated second,
  `clock.time_scale`) at which the real step fits it: wall / emulated.

    python bench/afd_crossing.py [--repeat 200] [--ffn-ranks 1,2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from collections.abc import Callable

import numpy as np
import ray
import torch

from actors.engine.runner.ffn_client import AfdConnector
from actors.engine.runner.model_runner import ModelRunner, RunnerInput
from actors.engine.runner.tiny_model import ensure_model, load_model
from actors.ffn.worker import FfnWorker, LocalFfnRanks
from cluster.config_load import load_designs
from cluster.hosts.ffn import FfnHost, RemoteFfnRanks
from emulation.step_shape import StepItem, StepShape
from emulation.time_model import time_model_for
from messages.afd import FfnBatch

SHAPES = {"decode 16": [(1, 2000)] * 16, "prefill 512": [(512, 0)]}
"""A step's requests as (new tokens, context): 16 decodes at 2,000 tokens of context, or one chunk."""


def _median_s(fn: Callable[[], object], repeat: int) -> float:
    fn()  # (warm)
    return statistics.median(timeit.repeat(fn, number=1, repeat=repeat))


def _runner_items(shape: list[tuple[int, int]]) -> list[RunnerInput]:
    rng = np.random.default_rng(0)
    items = []
    for i, (n, ctx) in enumerate(shape):
        blocks = list(range(200 * i, 200 * i + -(-(ctx + n + 1) // 16)))
        items.append(RunnerInput(f"r{i}", rng.integers(0, 8192, n).tolist(), ctx, blocks, ctx + n + 1, True))
    return items


def crossing_rows(cfg, num_ffn: int, repeat: int) -> list[dict[str, object]]:
    handles = [ray.remote(FfnHost).options(num_cpus=0).remote(cfg) for _ in range(num_ffn)]
    remote = RemoteFfnRanks(handles)
    local = LocalFfnRanks([FfnWorker.load(str(ensure_model(cfg.runner)), "cpu") for _ in range(num_ffn)])
    model = load_model(cfg.runner)
    hidden = model.config.hidden_size
    rows = []
    for name, shape in SHAPES.items():
        tokens = sum(n for n, _ in shape)
        per_rank = np.random.default_rng(0).standard_normal((tokens // num_ffn, hidden), np.float32)
        batches = [FfnBatch(0, per_rank) for _ in range(num_ffn)]
        remote_s = _median_s(lambda b=batches: remote.forward(b), repeat)
        local_s = _median_s(lambda b=batches: local.forward(b), repeat)
        items = _runner_items(shape)
        steps = {}
        for kind, ranks in (("colo", None), ("afd", remote)):
            ffn = None if ranks is None else AfdConnector(ranks, 2 * num_ffn)
            runner = ModelRunner(model, num_blocks=200 * len(items), block_size=16, ffn=ffn)
            for it in items:  # a working copy at its context (its KV values do not change the cost)
                kv_shape = (runner.num_layers, 2, runner.num_kv_heads, it.capacity, runner.head_dim)
                runner._working[it.request_id] = torch.zeros(kv_shape)
            steps[kind] = _median_s(lambda r=runner, i=items: r.execute(i), max(repeat // 4, 10))
        rows.append(
            {
                "F": num_ffn,
                "batch": name,
                "crossing_ms": remote_s * 1e3,
                "in_process_ms": local_s * 1e3,
                "ray_ms": (remote_s - local_s) * 1e3,
                "step_colo_ms": steps["colo"] * 1e3,
                "step_afd_ms": steps["afd"] * 1e3,
            }
        )
    for h in handles:
        ray.kill(h)
    return rows


DSV3_AFD = [
    "target.model=deepseek-v3",
    "target.time_model=operators",
    "pools.mixed.replicas=1",
    "pools.mixed.gpu=h800",
    "pools.mixed.afd.num_attention_ranks=16",
    "pools.mixed.afd.num_ffn_ranks=1",
    "pools.mixed.afd.ffn_ep=32",
    "pools.mixed.afd.link=rdma-400g",
    "pools.mixed.afd.num_micro_batches=3",
]
"""A DeepSeek-V3 AFD replica: 16 attention ranks of one H800, one FFN rank of 32 holding every expert,
three micro-batches over 400 Gb/s NICs (BF16 both ways)."""


def emulated_s(shape: list[tuple[int, int]]) -> float:
    """The emulated step of `shape` on `DSV3_AFD`'s replica."""
    cfg = load_designs("guide-l40s", ["collocated"], DSV3_AFD)[0]
    model = time_model_for(cfg, cfg.pools.mixed)
    return float(model.step_time_of(StepShape.of(StepItem(n, c, True) for n, c in shape)).total_s)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--ffn-ranks", default="1,2")
    args = p.parse_args()
    torch.set_num_threads(1)
    overrides = ["runner.compute=real", "runner.device=cpu", "runner.architecture=qwen3_moe"]
    cfg = load_designs("guide-l40s", ["collocated"], overrides)[0]
    ensure_model(cfg.runner)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        rows = [r for f in args.ffn_ranks.split(",") for r in crossing_rows(cfg, int(f), args.repeat)]
    finally:
        ray.shutdown()
    layers = load_model(cfg.runner).config.num_hidden_layers
    print(f"tiny Qwen3-MoE runner: {layers} MoE layers, so a step crosses {layers} times; medians, ms")
    print("crossing: one layer's call to F FFN actors and back, back to back; in proc: the same experts")
    print("without Ray; in step: (step AFD - step colo) / layers, a crossing after the actors idled")
    cols = ("F", "batch", "crossing", "in proc", "Ray", "in step", "step colo", "step AFD", "emulated")
    print(f"{cols[0]:>2} {cols[1]:<12}" + "".join(f"{c:>10}" for c in cols[2:]) + f"{'time_scale':>12}")
    for r in rows:
        sim_ms = emulated_s(SHAPES[str(r["batch"])]) * 1e3
        colo, afd = float(r["step_colo_ms"]), float(r["step_afd_ms"])  # type: ignore[arg-type]
        figures = (
            r["crossing_ms"],
            r["in_process_ms"],
            r["ray_ms"],
            (afd - colo) / layers,
            colo,
            afd,
            sim_ms,
        )
        print(
            f"{r['F']:>2} {r['batch']:<12}"
            + "".join(f"{x:>10.2f}" for x in figures)
            + f"{afd / sim_ms:>12.2f}"
        )
    print("time_scale: wall / emulated (clock.time_scale) at which the AFD step's real work fits its budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
