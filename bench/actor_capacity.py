"""Benchmark: how many engine actors this host holds at time_scale 1 with lag < 1 %.

Runs collocated deployments of N mixed engines on a local Ray (the guide's target and workload, the
offered rate scaled with N so every engine stays busy), for growing N, with compute skip and with real
compute, and reports each N's lag; the capacity is the largest N whose lag stays under 1 %.

    python bench/actor_capacity.py [--skip 2,4,8,16,32] [--real 1,2,3,4] [--seconds 40]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cluster.config_load import load_designs
from cluster.live import run_live


def trial(n: int, compute: str, seconds: float) -> dict:
    rate_per_engine = 0.3  # requests/s: each engine decodes ~2 streams and prefills now and then
    overrides = [
        f"pools.mixed.replicas={n}",
        f"runner.compute={compute}",
        "clock.mode=live",
        "clock.time_scale=1",
        f"workload.rate={rate_per_engine * n}",
        f"workload.num_requests={max(2, int(rate_per_engine * n * seconds))}",
        "workload.prompt_len=4096",
        "workload.output_len=128",
    ]
    cfg = load_designs("guide-l40s", ["collocated"], overrides)[0]
    t = time.perf_counter()
    s = run_live(cfg).summary
    return {
        "compute": compute,
        "num_engines": n,
        "lag_fraction": round(s["lag_fraction"], 4),
        "max_overrun_ms": round(s["max_overrun_ms"], 1),
        "completed": s["completed"],
        "failed": s["failed"],
        "wall_s": round(time.perf_counter() - t, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--skip", default="2,4,8,16,32")
    p.add_argument("--real", default="1,2,3,4")
    p.add_argument("--seconds", type=float, default=40.0, help="emulated seconds of arrivals per trial")
    p.add_argument("--out", default="runs/bench-actor-capacity")
    args = p.parse_args()
    rows, capacity = [], {}
    for compute, sizes in (("skip", args.skip), ("real", args.real)):
        capacity[compute] = 0
        for n in [int(x) for x in sizes.split(",") if x]:
            row = trial(n, compute, args.seconds)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if row["lag_fraction"] >= 0.01:
                break
            capacity[compute] = n
    report = {"capacity_at_time_scale_1": capacity, "trials": rows}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["capacity_at_time_scale_1"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
