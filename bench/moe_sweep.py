"""Benchmark: DeepSeek-V3 wide-EP P/D against collocated EP (preset deepseek-v3-h800), and Qwen3-30B-A3B
on one node, EP against TP (preset qwen3-30b-a3b-h100), in virtual mode.

DeepSeek-V3 designs: prefill EP32 with decode at EP 36, 72 and 144 (DeepSeek's), two EP32 prefill
replicas with decode EP72, and one collocated EP96 replica; each pool 32 redundant experts,
data-parallel attention and dual-batch overlap (the preset's). Rates in requests per emulated second,
ten seconds of Poisson arrivals a point (2,000-token prompts, 256-token answers). Qwen3-30B-A3B: the
preset's five designs at 20 and 60 requests a second, twenty seconds of arrivals. One seed; compute
skip. Per point: TTFT and TPOT, output tokens per second per GPU (all the design's GPUs) and goodput
under the preset's SLO (TTFT <= 2 s, TPOT <= 50 ms; over the whole run, the drain after the arrivals
included). Emulated figures only.

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
QWEN3_PRESET = "qwen3-30b-a3b-h100"
QWEN3_RATES = (20.0, 60.0)
QWEN3_ARRIVALS_S = 20.0


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


def qwen3_designs() -> list[TestbedConfig]:
    """The single-node Qwen3-30B-A3B preset's designs (EP against TP and DP)."""
    return load_designs(QWEN3_PRESET, None, ["runner.compute=skip"])


def run(configs: list[TestbedConfig], rates: list[float], arrivals_s: float) -> list[dict[str, object]]:
    """Every design at every rate, `arrivals_s` of arrivals a point; a row a point."""
    points = [
        dataclasses.replace(
            p, workload=dataclasses.replace(p.workload, num_requests=int(p.workload.rate * arrivals_s))
        )
        for p in sweep_points(configs, rates, [0])
    ]
    gpus = {cfg.design: num_gpus(cfg) for cfg in configs}
    slo = configs[0].slos[0]
    return [
        {
            "design": rec["design"], "gpus": gpus[rec["design"]], "rate": rec["rate"],
            "ttft_p50_ms": round(rec["median_ttft_ms"], 1), "ttft_p99_ms": round(rec["p99_ttft_ms"], 1),
            "tpot_p50_ms": round(rec["median_tpot_ms"], 1), "tpot_p99_ms": round(rec["p99_tpot_ms"], 1),
            "output_tok_s_per_gpu": round(rec["output_throughput"] / gpus[rec["design"]], 1),
            "goodput": round(rec["goodput"][slo], 2), "slo_attainment": round(rec["slo_attainment"][slo], 3),
        }
        for rec in run_sweep(points).records
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench-moe-sweep.json"))
    parser.add_argument("--rates", default="100,200,300,400", help="requests per emulated second")
    args = parser.parse_args()
    started = time.perf_counter()
    out = {
        PRESET: run(designs(), [float(r) for r in args.rates.split(",")], ARRIVALS_S),
        QWEN3_PRESET: run(qwen3_designs(), list(QWEN3_RATES), QWEN3_ARRIVALS_S),
    }
    wall_s = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**out, "wall_s": round(wall_s, 1)}, indent=1))
    for preset, rows in out.items():
        print(preset)
        for r in rows:
            print("  " + "  ".join(f"{k}={v}" for k, v in r.items()))
    print(f"{sum(map(len, out.values()))} points in {wall_s:.0f} s wall; written: {args.out}")


if __name__ == "__main__":
    main()
