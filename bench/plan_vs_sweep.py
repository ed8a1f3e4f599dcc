"""Benchmark: `testbed plan` against the exhaustive sweep of the same space, wall time and answer.

Two spaces, each planned, then replayed exhaustively (every candidate x load x seed, `--exhaustive`),
one after the other in this process's children:

- guide: preset guide-l40s (100 requests per replay), designs collocated / pd-testbox / pd-fast x
  max_num_batched_tokens 1024, 2048, 4096, 8192 x 16 rates 0.2-3.2 req/s x 3 seeds, target
  ttft:p90<=2s,tpot:p90<=50ms;
- weka: preset agentic-h200 over the shared WEKA Claude Code sessions (first 20 turns each),
  collocated (2 or 4 engines) and P/D (1-3 prefill x 1-3 decode) within 4 GPUs, round robin or
  KV-aware, 13 speedups 1-64 (steps of 1.41x), one seed (a trace's arrivals do not depend on it),
  target ttft:p90<=3s,itl:p99<=25ms.

Prints per space: both top candidates and goodputs, the rate steps between them, replays and wall
seconds on each side and their ratio (the aim: the same top, within one load step, >= 5x faster).

    .venv/bin/python bench/plan_vs_sweep.py [--spaces guide,weka] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cluster.cli import main as testbed

ROOT = Path(__file__).resolve().parents[1]
WEKA = ROOT.parent / "shared" / "traces" / "weka_claude_code"
SPACES = {
    "guide": [
        *("--preset guide-l40s --num-requests 100 --seeds 3 --slo ttft:p90<=2s,tpot:p90<=50ms".split()),
        *("--vary scheduler.max_num_batched_tokens=1024,2048,4096,8192 --loads".split()),
        ",".join(f"{0.2 * i:.1f}" for i in range(1, 17)),
    ],
    "weka": [
        *f"--preset agentic-h200 --trace {WEKA} --set replay.max_turns=20 --seeds 1".split(),
        *("--slo ttft:p90<=3s,itl:p99<=25ms --max-gpus 4 --loads".split()),
        ",".join(f"{2 ** (i / 2):.3g}" for i in range(13)),  # 1 to 64, steps of 1.41x
        *("--vary router.policy=round_robin,kv_aware --vary collocated:pools.mixed.replicas=2,4".split()),
        *("--vary pd:pools.prefill.replicas=1,2,3 --vary pd:pools.decode.replicas=1,2,3".split()),
    ],
}


def run(argv: list[str], out: Path) -> dict:
    start = time.perf_counter()
    if testbed(["plan", *argv, "--out", str(out)]) != 0:
        raise SystemExit(f"testbed plan {' '.join(argv)} failed")
    wall_s = time.perf_counter() - start
    plan = json.loads((out / "plan.json").read_text())
    return {"wall_s": wall_s, "plan": plan, "top": plan["targets"][0]["rows"][0]}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--spaces", default="guide,weka")
    p.add_argument("--out", default="runs/bench-plan-vs-sweep")
    args = p.parse_args()
    report = {}
    for name in args.spaces.split(","):
        plan = run(SPACES[name], Path(args.out) / name / "plan")
        sweep = run([*SPACES[name], "--exhaustive"], Path(args.out) / name / "exhaustive")
        loads = plan["plan"]["loads"]
        a, b = plan["top"], sweep["top"]
        steps = (
            abs(loads.index(a["goodput_load"]) - loads.index(b["goodput_load"]))
            if a["goodput_load"] is not None and b["goodput_load"] is not None
            else None
        )
        report[name] = {
            "num_candidates": plan["plan"]["num_candidates"],
            "plan_top": [a["candidate"], a["goodput_load"]],
            "exhaustive_top": [b["candidate"], b["goodput_load"]],
            "same_top": a["candidate"] == b["candidate"],
            "load_steps_apart": steps,
            "plan_replays": plan["plan"]["num_runs"],
            "exhaustive_replays": sweep["plan"]["num_runs"],
            "plan_wall_s": round(plan["wall_s"], 1),
            "exhaustive_wall_s": round(sweep["wall_s"], 1),
            "wall_ratio": round(sweep["wall_s"] / plan["wall_s"], 2),
        }
        print(json.dumps({name: report[name]}, indent=2), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
