"""Soak: a long virtual replay of real traces with faults injected, memory sampled as it runs.

The WEKA Claude Code sessions (551 requests over ~8.5 emulated hours, contexts up to ~200k tokens)
and the Mooncake conversation window (3,658 requests), replayed on the agentic-h200 preset's P/D
design (2 prefill + 2 decode H200s) with every fault kind on: 2 % of KV loads failing (recomputed on
decode), the link at a tenth of its bandwidth in recurring windows, the proxy killed (and restarted)
and a prefill engine killed part-way.
Two more prefill engines stand by (4 in all): prefill-1 also hangs (stops answering, no error) later
in the run, and the proxy gives up on each prefill there after `router.prefill_timeout_s` and retries
it elsewhere. (With 3, the one left is overloaded: its prefills time out and fail, in virtual and live
mode alike: 49 of the live window's 339 requests.)
Each replay runs `--rounds` times in one process. Checked: every request has exactly one row
(completed + failed + rejected = sent), every engine ends empty (`run_virtual` asserts it: no
request, block, stream or working KV left), and the process's RSS after each round once its output is
dropped (a round peaks while it holds its results; what one left behind would pile up across them).

`--live`: the Mooncake window's first two minutes instead, in live mode on a local 3-node Ray (prefill
and decode engines on nodes of their own), at real time with the same fault kinds (the kill and the
hang are a real actor killed and a real step loop stopped), `--rounds` times; the engine and proxy
actors' RSS is sampled every two wall seconds while each round runs (each round deploys them anew);
their drains check them empty.

    python bench/soak.py [--out runs/bench-soak.json] [--rounds 3] [--live]
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import time
from collections import Counter
from pathlib import Path

import pandas as pd

from cluster.config_load import load_designs
from cluster.virtual import run_virtual

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
REPLAYS = {
    "weka": (TRACES / "weka_claude_code", 3 * 3600.0, 5 * 3600.0),
    "mooncake": (TRACES / "mooncake_fast25" / "conversation_trace.window_0s_1200s.jsonl", 600.0, 900.0),
}
"""trace -> (its path, when prefill-0 is killed and when prefill-1 hangs: emulated seconds)"""
LIVE_WINDOW_S = 120.0
"""--live: the Mooncake window's first seconds replayed (at real time)."""


def rss_mib() -> float:
    """This process's resident memory now (Linux /proc; ru_maxrss only gives the peak)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def faults(kill_at_s: float, hang_at_s: float, slow_every_s: int = 1800, slow_s: int = 120) -> list[str]:
    starts = range(slow_every_s // 6, 30000, slow_every_s)
    windows = ", ".join(f"{{start_s: {t}, end_s: {t + slow_s}, bandwidth_factor: 0.1}}" for t in starts)
    return [
        "pools.prefill.replicas=4",
        "faults.kv_transfer_failure_rate=0.02",
        "kv_transfer.load_failure_policy=recompute",
        f"faults.link_slowdowns=[{windows}]",
        f"faults.engine_kills=[{{engine: prefill-0, at_s: {kill_at_s}}}]",
        f"faults.engine_hangs=[{{engine: prefill-1, at_s: {hang_at_s}}}]",
        f"faults.proxy_kills=[{kill_at_s / 2}]",
        "router.prefill_timeout_s=30",
    ]


SUMMARY_KEYS = (
    "completed", "failed", "rejected", "num_injected_load_failures", "num_recomputed_loads",
    "num_prefill_retries", "num_prefill_timeouts", "num_engines_lost", "num_engines_hung",
    "num_proxy_restarts",
)  # fmt: skip


def failure_causes(results: pd.DataFrame) -> dict[str, int]:
    """Failed requests by the first words of their error (what failed them)."""
    failed = results.loc[~results["ok"], "error"].astype(str)
    return dict(Counter(" ".join(e.split()[:4]) for e in failed))


def soak(name: str, rounds: int) -> dict[str, object]:
    path, kill_at_s, hang_at_s = REPLAYS[name]
    sets = [
        "runner.compute=skip",
        f"replay.trace={path}",
        "router.policy=kv_aware",
        *faults(kill_at_s, hang_at_s),
    ]
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
        causes = failure_causes(out.results)
        del out  # what the round leaves behind, not what it returned
        gc.collect()
        per_round.append({"requests": n, "rss_mib": round(rss_mib(), 1), **{k: s[k] for k in SUMMARY_KEYS},
                          "failure_causes": causes, "emulated_s": round(s["duration_s"], 1)})  # fmt: skip
    return {
        "trace": name,
        "rounds": per_round,
        "wall_s": round(time.perf_counter() - start, 1),
        "rss_start_mib": round(start_rss, 1),
        "rss_end_mib": round(rss_mib(), 1),
        "rss_peak_mib": round(max(samples), 1),
    }


def actor_rss_mib() -> float:
    """The engine and proxy actors' resident memory now, summed (their processes on this machine)."""
    total = 0
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes()
            if cmd.startswith(b"ray::") and (b"EngineHost" in cmd or b"ProxyHost" in cmd):
                total += int((proc / "statm").read_text().split()[1])
        except (OSError, ValueError):  # gone meanwhile, or not a process
            continue
    return total * resource.getpagesize() / 2**20


def live_soak(rounds: int) -> dict[str, object]:
    import ray
    from ray.cluster_utils import Cluster

    from cluster.live import run_live

    path = REPLAYS["mooncake"][0]
    sets = [
        "runner.compute=skip", f"replay.trace={path}", f"replay.window_s=[0, {LIVE_WINDOW_S}]",
        "router.policy=kv_aware", "clock.mode=live", "clock.time_scale=1", "metrics.linger_s=0",
        *faults(40.0, 70.0, slow_every_s=40, slow_s=10),
    ]  # fmt: skip
    (cfg,) = load_designs("agentic-h200", ["pd"], sets)
    node = {"node_ip_address": "127.0.0.2", "num_cpus": 1, "object_store_memory": 200 * 1024**2}
    c = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    c.add_node(**node, resources={"prefill": 4})
    c.add_node(**node, resources={"decode": 2})
    ray.init(address=c.address, _node_ip_address="127.0.0.2")
    start = time.perf_counter()
    per_round = []
    try:
        for _ in range(rounds):
            samples: list[float] = []
            out = run_live(cfg, on_tick=lambda _t, _lag, samples=samples: samples.append(actor_rss_mib()))
            s = out.summary
            n = len(out.results)
            assert s["completed"] + s["failed"] + s["rejected"] == n and out.results["request_id"].is_unique
            per_round.append({
                "requests": n, **{k: s[k] for k in SUMMARY_KEYS}, "lag_fraction": round(s["lag_fraction"], 4),
                "actor_rss_mib_first": round(samples[0], 1), "actor_rss_mib_last": round(samples[-1], 1),
                "actor_rss_mib_peak": round(max(samples), 1),
                "clock_uncertainty_ms": max(v["uncertainty_ms"] for v in s["clock_sync"].values()),
                "failure_causes": failure_causes(out.results),
            })  # fmt: skip
    finally:
        ray.shutdown()
        c.shutdown()
    return {"trace": "mooncake-live", "window_s": LIVE_WINDOW_S, "rounds": per_round,
            "wall_s": round(time.perf_counter() - start, 1)}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--live", action="store_true", help="the short live soak on a local 3-node Ray")
    args = p.parse_args()
    rows = [live_soak(args.rounds)] if args.live else [soak(name, args.rounds) for name in REPLAYS]
    out = Path(args.out or f"runs/bench-soak{'-live' if args.live else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
