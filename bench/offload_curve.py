"""Benchmark: KV offloading on the shared Mooncake window, prefix hits and TTFT against the tiers' size.

Preset offload-h200 (four Llama-3.1-8B engines on H200s, KV-aware routing weighing tier hits), virtual
mode, compute skip, the 20-minute conversation window (3,658 requests): GPU KV only, then a host tier
per engine of 64 to 256 GB (the profile's most: a DGX H200's 2 TB over 8 GPUs), then 256 GB with a
local disk tier of 1 and 4 TB, then a store shared by the four engines. Per point: achieved prefix
hits (GPU cache and tiers) against the trace's infinite-cache rate, the share the tiers supplied,
TTFT p50 / p99 and the replay's wall time.

    python bench/offload_curve.py [--out runs/bench-offload-curve.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cluster.config_load import load_designs
from cluster.virtual import run_virtual

TRACE = (
    Path(__file__).resolve().parents[2]
    / "shared"
    / "traces"
    / "mooncake_fast25"
    / "conversation_trace.window_0s_1200s.jsonl"
)
POINTS = [(0, 0, 0), (64, 0, 0), (128, 0, 0), (192, 0, 0), (256, 0, 0), (256, 1000, 0), (256, 4000, 0)]
POINTS += [(0, 0, 1024), (128, 0, 512), (128, 1000, 512)]
"""(host_gb, disk_gb) per engine, and the shared store's shared_gb (over rdma-400g): the four H200s'
1,024 GB of host memory all in the store, or half of it."""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="runs/bench-offload-curve.json")
    args = p.parse_args()
    rows = []
    for host_gb, disk_gb, shared_gb in POINTS:
        overrides = [
            "runner.compute=skip",
            f"replay.trace={TRACE}",
            f"kv_offload.host_gb={host_gb}",
            f"kv_offload.disk_gb={disk_gb}",
            f"kv_offload.shared_gb={shared_gb}",
            "kv_offload.shared_link=rdma-400g",
        ]
        cfg = load_designs("offload-h200", ["collocated"], overrides)[0]
        start = time.perf_counter()
        out = run_virtual(cfg)
        wall_s = time.perf_counter() - start
        s, df = out.summary, out.results
        ok = df[df["ok"]]
        rows.append(
            {
                "host_gb": host_gb,
                "disk_gb": disk_gb,
                "shared_gb": shared_gb,
                "completed": s["completed"],
                "prefix_hit_rate": round(s["prefix_hit_rate"], 4),
                "theoretical_prefix_hit_rate": round(s["theoretical_prefix_hit_rate"], 4),
                "offloaded_share": round(
                    ok["prompt_offloaded_tokens"].sum() / ok["num_prompt_tokens"].sum(), 4
                ),
                "median_ttft_ms": round(s["median_ttft_ms"], 1),
                "p99_ttft_ms": round(s["p99_ttft_ms"], 1),
                "wall_s": round(wall_s, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
