"""Soak: a long virtual replay of real traces with faults injected, memory sampled as it runs.

The WEKA Claude Code sessions (551 requests over ~8.5 emulated hours, contexts up to ~200k tokens)
and the Mooncake conversation window (3,658 requests), replayed on the agentic-h200 preset's P/D
design (2 prefill + 2 decode H200s) with every fault kind on: 2 % of KV loads failing (recomputed on
decode), the link at a tenth of its bandwidth in recurring windows, a prefill engine killed part-way.
Each replay runs `--rounds` times in one process. Checked: every request has exactly one row
(completed + failed + rejected = sent), every engine ends empty (`run_virtual` asserts it: no
request, block, stream or working KV left), and the process's RSS after each round once its output is
dropped (a round peaks while it holds its results; what one left behind would pile up across them).

    python bench/soak.py [--out runs/bench-soak.json] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import time
from pathlib import Path

from cluster.config_load import load_designs
from cluster.virtual import run_virtual

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
REPLAYS = {
    "weka": (TRACES / "weka_claude_code", 3 * 3600.0),
    "mooncake": (TRACES / "mooncake_fast25" / "conversation_trace.window_0s_1200s.jsonl", 600.0),
}
"""trace -> (its path, when prefill-0 is killed: emulated seconds)"""


def rss_mib() -> float:
    """This process's resident memory now (Linux /proc; ru_maxrss only gives the peak)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def faults(kill_at_s: float) -> list[str]:
    windows = ", ".join(
        f"{{start_s: {t}, end_s: {t + 120}, bandwidth_factor: 0.1}}" for t in range(300, 30000, 1800)
    )
    return [
        "faults.kv_transfer_failure_rate=0.02",
        "kv_transfer.load_failure_policy=recompute",
        f"faults.link_slowdowns=[{windows}]",
        f"faults.engine_kills=[{{engine: prefill-0, at_s: {kill_at_s}}}]",
    ]


def soak(name: str, rounds: int) -> dict[str, object]:
    path, kill_at_s = REPLAYS[name]
    sets = ["runner.compute=skip", f"replay.trace={path}", "router.policy=kv_aware", *faults(kill_at_s)]
    (cfg,) = load_designs("agentic-h200", ["pd"], sets)
    samples: list[float] = []

    def sample(_: object) -> None:
        samples.append(rss_mib())

    start_rss, start = rss_mib(), time.perf_counter()
    per_round = []
    for _ in range(rounds):  # the same replay again: memory a round leaves behind would pile up
        out = run_virtual(cfg, on_result=sample)
        s = out.summary
        n = len(out.results)
        assert s["completed"] + s["failed"] + s["rejected"] == n and out.results["request_id"].is_unique
        del out  # what the round leaves behind, not what it returned
        gc.collect()
        per_round.append({"requests": n, "rss_mib": round(rss_mib(), 1), **{
            k: s[k] for k in ("completed", "failed", "rejected", "num_injected_load_failures",
                              "num_recomputed_loads", "num_prefill_retries", "num_engines_lost")
        }, "emulated_s": round(s["duration_s"], 1)})  # fmt: skip
    return {
        "trace": name,
        "rounds": per_round,
        "wall_s": round(time.perf_counter() - start, 1),
        "rss_start_mib": round(start_rss, 1),
        "rss_end_mib": round(rss_mib(), 1),
        "rss_peak_mib": round(max(samples), 1),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="runs/bench-soak.json")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    rows = [soak(name, args.rounds) for name in REPLAYS]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
