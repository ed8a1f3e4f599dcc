"""Benchmark: DeepSeek-V3 wide-EP P/D against collocated EP (preset deepseek-v3-h800), in virtual mode.

Designs: prefill EP32 with decode at EP 36, 72 and 144 (DeepSeek's), two EP32 prefill replicas with
decode EP72, and one collocated EP96 replica;
each pool 32 redundant experts, data-parallel attention and dual-batch overlap (the preset's). Rates in
requests per emulated second, ten seconds of Poisson arrivals a point (2,000-token prompts, 256-token
answers), one seed; compute skip. Per point: TTFT and TPOT, output tokens per second per GPU (all the
design's GPUs) and goodput under the preset's SLO (TTFT <= 2 s, TPOT <= 50 ms). Emulated figures only.

    python bench/moe_sweep.py [--out runs/bench-moe-sweep.json] [--rates 100,200,300,400]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from cluster.config_load import load_designs
from cluster.sweep import run_sweep, sweep_points
from emulation.config import TestbedConfig

PRESET = "deepseek-v3-h800"
DECODE_EP = (36, 72, 144)
ARRIVALS_S = 10.0
SLO = "ttft<=2s,tpot<=50ms"


def designs() -> list[TestbedConfig]:
    """P/D at each decode EP width (one EP32 prefill replica), P/D with two prefill replicas, then the
    collocated EP96 replica."""
    (pd,) = load_designs(PRESET, ["pd-ep32-ep72"], ["runner.compute=skip"])
    (colo,) = load_designs(PRESET, ["colo-ep96"], ["runner.compute=skip"])
    out = [_pd(pd, f"pd-ep32-ep{ep}", 1, ep) for ep in DECODE_EP]
    return [*out, _pd(pd, "pd-2x-ep32-ep72", 2, 72), colo]


def _pd(pd: TestbedConfig, name: str, num_prefill: int, decode_ep: int) -> TestbedConfig:
    prefill = dataclasses.replace(pd.pools.prefill, replicas=num_prefill)
    decode = dataclasses.replace(pd.pools.decode, ep=decode_ep)
    pools = dataclasses.replace(pd.pools, prefill=prefill, decode=decode)
    return dataclasses.replace(pd, design=name, pools=pools)


def num_gpus(cfg: TestbedConfig) -> int:
    return sum(pool.replicas * pool.num_gpus for _, pool in cfg.pools.by_role())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench-moe-sweep.json"))
    parser.add_argument("--rates", default="100,200,300,400", help="requests per emulated second")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    points = [
        dataclasses.replace(
            p, workload=dataclasses.replace(p.workload, num_requests=int(p.workload.rate * ARRIVALS_S))
        )
        for p in sweep_points(designs(), rates, [0])
    ]
    gpus = {cfg.design: num_gpus(cfg) for cfg in designs()}
    started = time.perf_counter()
    sweep = run_sweep(points)
    rows = []
    for rec in sweep.records:
        rows.append({
            "design": rec["design"], "gpus": gpus[rec["design"]], "rate": rec["rate"],
            "ttft_p50_ms": round(rec["median_ttft_ms"], 1), "ttft_p99_ms": round(rec["p99_ttft_ms"], 1),
            "tpot_p50_ms": round(rec["median_tpot_ms"], 1), "tpot_p99_ms": round(rec["p99_tpot_ms"], 1),
            "output_tok_s_per_gpu": round(rec["output_throughput"] / gpus[rec["design"]], 1),
            "goodput": round(rec["goodput"][SLO], 2), "slo_attainment": round(rec["slo_attainment"][SLO], 3),
        })  # fmt: skip
    wall_s = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "wall_s": round(wall_s, 1)}, indent=1))
    for r in rows:
        print("  ".join(f"{k}={v}" for k, v in r.items()))
    print(f"{len(points)} points in {wall_s:.0f} s wall; written: {args.out}")


if __name__ == "__main__":
    main()
