"""Benchmark: replaying the shared traces in virtual mode (compute skip), wall time and reuse.

- The whole Mooncake conversation window (3,658 requests, 20 minutes of Kimi traffic) on the
  agentic-h200 preset's collocated design (four Llama-3.1-8B engines on H200s, max_model_len 262k so
  every request fits), KV-aware and round-robin routing: wall seconds (aim: under 5), emulated
  duration, completed requests, achieved and theoretical prefix-hit rates, median and p99 TTFT.
- The WEKA Claude Code sessions (11 sessions, 551 requests with sub-agents) on the same design, every
  router: the same figures.

Each on every time model asked for (default: the preset's own; `--time-models operators measured`
also gives `measured`'s wall over `operators`' for each trace and router, aim: at most 1.5).

    python bench/trace_replay.py [--out runs/bench-trace-replay.json] [--time-models preset ...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

from cluster.config_load import load_designs
from cluster.virtual import run_virtual

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
RUNS = [
    (
        "mooncake",
        TRACES / "mooncake_fast25" / "conversation_trace.window_0s_1200s.jsonl",
        ["kv_aware", "round_robin"],
    ),
    ("weka", TRACES / "weka_claude_code", ["kv_aware", "kv_estimated", "session_affinity", "round_robin"]),
]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="runs/bench-trace-replay.json")
    p.add_argument("--time-models", nargs="+", default=["preset"],
                   choices=["preset", "aggregate", "operators", "measured"])  # fmt: skip
    args = p.parse_args()
    rows = []
    for time_model, (name, path, policies) in itertools.product(args.time_models, RUNS):
        for policy in policies:
            overrides = ["runner.compute=skip", f"replay.trace={path}", f"router.policy={policy}"]
            if time_model != "preset":
                overrides.append(f"target.time_model={time_model}")
            cfg = load_designs("agentic-h200", ["collocated"], overrides)[0]
            start = time.perf_counter()
            out = run_virtual(cfg)
            wall_s = time.perf_counter() - start
            s = out.summary
            row = {
                "time_model": time_model,
                "trace": name,
                "router": policy,
                "wall_s": round(wall_s, 1),
                "requests": len(out.results),
                "completed": s["completed"],
                "emulated_s": round(s["duration_s"], 1),
                "prefix_hit_rate": round(s["prefix_hit_rate"], 4),
                "theoretical_prefix_hit_rate": round(s["theoretical_prefix_hit_rate"], 4),
                "theoretical_with_answers": round(s["theoretical_prefix_hit_rate_with_answers"], 4),
                "median_ttft_ms": round(s["median_ttft_ms"], 1),
                "p99_ttft_ms": round(s["p99_ttft_ms"], 1),
            }
            rows.append(row)
            print(json.dumps(row))
    walls = {(r["time_model"], r["trace"], r["router"]): r["wall_s"] for r in rows}
    for r in rows:
        if r["time_model"] == "measured" and ("operators", r["trace"], r["router"]) in walls:
            r["measured_over_operators_wall"] = round(
                r["wall_s"] / walls["operators", r["trace"], r["router"]], 2
            )
            print(json.dumps({k: r[k] for k in ("trace", "router", "measured_over_operators_wall")}))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
