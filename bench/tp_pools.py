"""Benchmark: sizing tensor-parallel pools for Llama-3.1-70B on H100 SXM (preset llama70b-h100-tp).

Two questions a P/D design answers separately ("two knobs instead of one"), on each time model:

1. Prefill layout: an 8,192-token prompt's TTFT on a TP-4 and a TP-8 prefill engine, alone (no queue):
   a virtual run of one request through P/D (chunked prefill, the all-reduces, the rank-to-rank KV
   handoff to a TP-4 decode engine, its first step); its prefill part too.
2. Decode layout: the largest batch one TP-4 or TP-8 decode engine holds at 4k context within a 40 ms
   ITL: the smaller of what its KV memory holds (per GPU: memory x gpu_memory_utilization minus its
   weight shard, over its share of a token's KV) and what keeps a decode step within 40 ms; which one
   limits, and output tokens/s per GPU at that batch.

Emulated figures only (nothing measured on this machine).

    python bench/tp_pools.py [--out runs/bench-tp-pools.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cluster.config_load import load_designs
from cluster.virtual import run_virtual
from emulation.kv_cache import cdiv, kv_capacity_tokens
from emulation.profiles import GPUS, MODELS
from emulation.step_shape import StepItem, StepShape
from emulation.time_model import time_model_for

PRESET = "llama70b-h100-tp"
CONTEXT = 4096
ITL_TARGET_S = 0.040
TIME_MODELS = ("aggregate", "operators", "measured")


def prompt_ttft(design: str, time_model: str) -> dict[str, float]:
    """One 8k request alone through `design`: TTFT and its prefill part, ms."""
    sets = [f"target.time_model={time_model}", "workload.num_requests=1", "runner.compute=skip"]
    (cfg,) = load_designs(PRESET, [design], sets)
    df = run_virtual(cfg).results
    row = df.iloc[0]
    prefill_s = row["prefill_done_s"] - row["arrival_s"] - row["render_s"]
    return {"ttft_ms": round(row["ttft_s"] * 1e3, 1), "prefill_ms": round(prefill_s * 1e3, 1)}


def decode_capacity(design: str, time_model: str) -> dict[str, object]:
    """The largest decode batch at CONTEXT within ITL_TARGET_S on `design`'s decode engine."""
    (cfg,) = load_designs(PRESET, [design], [f"target.time_model={time_model}"])
    pool, model = cfg.pools.decode, MODELS[cfg.target.model]
    block = cfg.scheduler.block_size
    tokens = kv_capacity_tokens(model, GPUS[pool.gpu], pool, cfg.target.gpu_memory_utilization)
    memory_batch = tokens // (cdiv(CONTEXT + 1, block) * block)
    step = time_model_for(cfg, pool)

    def step_s(batch: int) -> float:
        return step.step_time_of(StepShape.of([StepItem(1, CONTEXT, True)] * batch)).total_s

    lo, hi = 0, memory_batch  # the largest batch within the ITL target, by bisection
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if step_s(mid) <= ITL_TARGET_S else (lo, mid - 1)
    batch = lo
    return {
        "decode_tp": pool.tp,
        "memory_batch": memory_batch,
        "batch": batch,
        "limited_by": "memory" if batch == memory_batch else "ITL",
        "step_ms": round(step_s(batch) * 1e3, 1),
        "tokens_per_s_per_gpu": round(batch / step_s(batch) / pool.tp),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="runs/bench-tp-pools.json")
    args = p.parse_args()
    report: dict[str, list[dict[str, object]]] = {"prefill": [], "decode": []}
    for design, prefill_tp in (("p-tp4-d-tp4", 4), ("p-tp8-d-tp4", 8)):
        for tm in TIME_MODELS:
            row = {"prefill_tp": prefill_tp, "time_model": tm, **prompt_ttft(design, tm)}
            report["prefill"].append(row)
            print(json.dumps(row), flush=True)
    for design in ("p-tp4-d-tp4", "p-tp4-d-tp8"):
        for tm in TIME_MODELS:
            row = {"time_model": tm, **decode_capacity(design, tm)}
            report["decode"].append(row)
            print(json.dumps(row), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
