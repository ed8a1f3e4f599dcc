"""Benchmark: live mode on Ray against virtual mode, same designs, seeds and workloads.

For each design and rate, runs the guide workload in virtual time and live (local Ray), then reports
live/virtual ratios of median TTFT, median ITL and p99 ITL, with the live run's lag and time_scale.
Acceptance: medians within 5 %, p99 ITL within 15 %, lag < 1 %.

    python bench/live_vs_virtual.py [--compute skip|real] [--time-scale S|auto] [--num-requests 60]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cluster.calibrate import resolve_time_scale
from cluster.config_load import load_designs
from cluster.live import run_live
from cluster.ray_connect import connect, disconnect
from cluster.virtual import run_virtual

KEYS = ("median_ttft_ms", "median_itl_ms", "p99_itl_ms")
TOLERANCE = {"median_ttft_ms": 0.05, "median_itl_ms": 0.05, "p99_itl_ms": 0.15}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--designs", default="collocated,pd-testbox,pd-fast")
    p.add_argument("--rates", default="0.2,0.4")
    p.add_argument("--num-requests", type=int, default=60)
    p.add_argument("--compute", default="skip")
    p.add_argument("--time-scale", default="1.0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/bench-live-vs-virtual")
    args = p.parse_args()
    rows = []
    base = [
        f"runner.compute={args.compute}",
        f"workload.num_requests={args.num_requests}",
        f"seed={args.seed}",
    ]
    configs = load_designs("guide-l40s", args.designs.split(","), base)
    started = connect(configs, None)
    try:
        for rate in [float(r) for r in args.rates.split(",")]:
            for cfg in load_designs("guide-l40s", args.designs.split(","), [*base, f"workload.rate={rate}"]):
                virtual = run_virtual(cfg).summary
                live_cfg = resolve_time_scale(
                    load_designs(
                        "guide-l40s",
                        [cfg.design],
                        [
                            *base,
                            f"workload.rate={rate}",
                            "clock.mode=live",
                            f"clock.time_scale={args.time_scale}",
                        ],
                    )[0]
                )
                t = time.perf_counter()
                live = run_live(live_cfg).summary
                row = {
                    "design": cfg.design,
                    "rate": rate,
                    "time_scale": live["time_scale"],
                    "wall_s": round(time.perf_counter() - t, 1),
                    "lag_fraction": live["lag_fraction"],
                    "max_overrun_ms": round(live["max_overrun_ms"], 2),
                    "completed": [virtual["completed"], live["completed"]],
                }
                ok = live["lag_fraction"] < 0.01
                for k in KEYS:
                    ratio = live[k] / virtual[k]
                    row[k] = {
                        "virtual": round(virtual[k], 2),
                        "live": round(live[k], 2),
                        "ratio": round(ratio, 4),
                    }
                    ok &= abs(ratio - 1) <= TOLERANCE[k]
                row["within_tolerance"] = bool(ok)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        if started:
            disconnect()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"bench-{args.compute}.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
