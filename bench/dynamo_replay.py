"""Benchmark: the testbed against NVIDIA Dynamo's offline replay (ai-dynamo 1.6.1, Rust core) on the
same trace, side by side. Never a dependency of the project: Dynamo lives in a venv of its own.

    .venv/bin/python bench/dynamo_replay.py [--rounds 3] [--cases pd-kv,...] [--out FILE.json]

What runs: the shared Mooncake window (3,658 requests) as bench/trace_replay.py replays it (preset
agentic-h200, compute skip, virtual mode, `cluster.virtual.run_virtual`), in four cases: `collocated`
(four Llama-3.1-8B/H200 engines) and `pd` (two prefill + two decode over rdma-400g), each with round
robin and KV-aware routing. Dynamo replays the same JSONL through `dynamo.replay.run_trace_replay`
(`trace_block_size=512`: Mooncake's hash IDs) with what the testbed's config resolves to:

- engine arguments (bench/dynamo_profile.py `engine_args`): block_size, num_gpu_blocks (the blocks
  requests can hold), max_num_batched_tokens, max_num_seqs, max_model_len, prefix caching, chunked
  prefill; P/D: `prefill_engine_args` / `decode_engine_args` with `worker_type`, `num_prefill_workers`,
  `num_decode_workers`, `kv_transfer_bandwidth` (GB/s, the link's) and `kv_transfer_bytes_per_token`
  (the model's), `kv_transfer_timing_mode` destination_missing;
- timing: `{"type": "external", "provider": "dynamo_profile", "config": {"path": NPZ}}`, the NPZ filled
  from the testbed's own step-time model (`time_model_for(cfg, pool).step_time_of`) over a grid; keys,
  units and lookups as bench/dynamo_profile.py's docstring cites them from the installed package;
- router: `round_robin`, or `kv_router` with its defaults (prefill_load_scale 1.0 and overlap credit
  1.0, temperature 0: `KvRouterConfig` in dynamo/_core.pyi), as the testbed's kv_aware cost
  overlap_weight (1.0) x blocks to prefill + active blocks, temperature 0.

Rounds alternate testbed, Dynamo, testbed, Dynamo, ... per case, each replay in a fresh subprocess
(the project's interpreter; the Dynamo venv's). Wall time is the replay call alone
(`run_virtual(cfg)`; `run_trace_replay(...)`, trace parsing included on both sides): the interpreter's
start, the imports and one untimed warm-up replay of the trace's first lines (lazy imports, first-call
costs) come before the clock starts; CPU seconds of the call are reported beside it (Dynamo's also
reports its own `wall_time_ms`). Per case: the median over rounds of testbed / Dynamo wall time,
completed requests, prefix-hit rates, TTFT and ITL medians, and for every figure that disagrees the
differences between the two configurations that bear on it, measured (dynamo_profile.pricing_gaps).

Dynamo is installed when missing (`python3 -m venv`, then ai-dynamo-runtime and its dependencies, then
ai-dynamo itself without dependencies: its `aisimulate` dependency is a stub that downloads from an
index unreachable here). If it cannot be installed or run, one line says so and the testbed's figures
are printed alone (exit 0).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "mooncake_fast25" / "conversation_trace.window_0s_1200s.jsonl"
PRESET = "agentic-h200"
DYNAMO_VERSION = "1.6.1"
CACHE = Path(os.environ.get("TESTBED_CACHE") or Path.home() / ".cache" / "disagg-testbed")
DYNAMO_VENV = CACHE / f"dynamo-{DYNAMO_VERSION}"
DYNAMO_DEPS = (
    f"ai-dynamo-runtime=={DYNAMO_VERSION} aiohttp certifi kubernetes msgspec prometheus-client pyzmq "
    "redis tqdm transformers typing-extensions zstandard"
).split()
CASES = {  # name: (design, testbed router, Dynamo router_mode)
    "collocated-rr": ("collocated", "round_robin", "round_robin"),
    "collocated-kv": ("collocated", "kv_aware", "kv_router"),
    "pd-rr": ("pd", "round_robin", "round_robin"),
    "pd-kv": ("pd", "kv_aware", "kv_router"),
}
WARMUP_LINES = 20
MARK = "@@result "
REL_TOL, HITS_TOL = 0.10, 0.01  # medians within 10 %, hit rates within a point: agreement


# -- the two sides, each in its own subprocess ------------------------------------------------------


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the process
    return r.ru_utime + r.ru_stime


def testbed_side(case: str, trace: str, warm: str) -> dict[str, Any]:
    start = time.perf_counter()
    from cluster.config_load import load_designs
    from cluster.virtual import run_virtual
    from messages.stats import EngineReport

    design, policy, _ = CASES[case]
    overrides = ["runner.compute=skip", f"router.policy={policy}"]
    import_s = time.perf_counter() - start
    start = time.perf_counter()
    run_virtual(load_designs(PRESET, [design], [*overrides, f"replay.trace={warm}"])[0])
    warm_s = time.perf_counter() - start
    cfg = load_designs(PRESET, [design], [*overrides, f"replay.trace={trace}"])[0]
    cpu, start = _cpu_s(), time.perf_counter()
    out = run_virtual(cfg)
    wall_s, cpu_s = time.perf_counter() - start, _cpu_s() - cpu
    s, ok = out.summary, out.results[out.results["ok"]]
    busy: dict[str, list[float]] = {}
    for report in out.engine_reports.values():
        if isinstance(report, EngineReport):  # not a LostEngine
            busy.setdefault(report.role, []).append(report.counters.busy_s / s["duration_s"])
    return {
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "import_s": import_s,
        "warmup_s": warm_s,
        "requests": len(out.results),
        "completed": s["completed"],
        "failed": s["failed"],
        "rejected": s["rejected"],
        "prefix_hit_rate": s["prefix_hit_rate"],
        "theoretical_prefix_hit_rate": s.get("theoretical_prefix_hit_rate"),
        "median_ttft_ms": s["median_ttft_ms"],
        "p99_ttft_ms": s["p99_ttft_ms"],
        "median_itl_ms": s["median_itl_ms"],
        "mean_ttft_ms": s["mean_ttft_ms"],
        "mean_e2e_ms": float(ok["e2el_s"].mean() * 1000.0),
        "mean_tpot_ms": s["mean_tpot_ms"],
        "emulated_s": s["duration_s"],
        "num_preemptions": s["num_preemptions"],
        "busy_share": {role: statistics.mean(v) for role, v in busy.items()},
    }


def dynamo_side(spec: dict[str, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    from dynamo.replay import run_trace_replay

    import_s = time.perf_counter() - start
    kwargs = spec["kwargs"]
    start = time.perf_counter()
    run_trace_replay(spec["warm"], **kwargs)
    warm_s = time.perf_counter() - start
    cpu, start = _cpu_s(), time.perf_counter()
    report = run_trace_replay(spec["trace"], **kwargs)
    wall_s, cpu_s = time.perf_counter() - start, _cpu_s() - cpu
    s = report.summary
    return {
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "import_s": import_s,
        "warmup_s": warm_s,
        "own_wall_time_ms": s.get("wall_time_ms"),
        "requests": s.get("num_requests"),
        "completed": s.get("completed_requests"),
        "prefix_hit_rate": s.get("prefix_cache_reused_ratio"),
        "median_ttft_ms": s.get("median_ttft_ms"),
        "p99_ttft_ms": s.get("p99_ttft_ms"),
        "median_itl_ms": s.get("median_itl_ms"),
        "mean_ttft_ms": s.get("mean_ttft_ms"),
        "mean_e2e_ms": s.get("mean_e2e_latency_ms"),
        "mean_tpot_ms": s.get("mean_tpot_ms"),
        "emulated_s": (s.get("duration_ms") or 0.0) / 1000.0,
        "summary": s,
    }


def _run_side(cmd: list[str], timeout: float = 1800) -> dict[str, Any]:
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
    raise RuntimeError(tail[0])


# -- Dynamo's venv -----------------------------------------------------------------------------------


def ensure_dynamo(venv: Path, install: bool) -> tuple[Path | None, str]:
    """The venv's interpreter once `dynamo.replay` imports there (installing it if allowed), or None
    and why not."""
    py = venv / "bin" / "python"
    probe = [str(py), "-c", "import dynamo.replay, importlib.metadata as m; print(m.version('ai-dynamo'))"]

    def ready() -> bool:
        if not py.exists():
            return False
        r = subprocess.run(probe, capture_output=True, text=True, timeout=300)
        return r.returncode == 0 and r.stdout.strip() == DYNAMO_VERSION

    if ready():
        return py, ""
    if not install:
        return None, f"ai-dynamo {DYNAMO_VERSION} is not installed in {venv} (--no-install)"
    pip = [str(py), "-m", "pip", "install", "-q"]
    steps = [
        [shutil.which("python3") or sys.executable, "-m", "venv", str(venv)],
        [*pip, *DYNAMO_DEPS],
        [*pip, "--no-deps", f"ai-dynamo=={DYNAMO_VERSION}"],
    ]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if r.returncode:
            last = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.returncode}"]
            return None, f"`{' '.join(cmd[:4])} ...` failed: {last[0]}"
    return (py, "") if ready() else (None, f"dynamo.replay does not import in {venv} after installing")


# -- side by side ------------------------------------------------------------------------------------


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def _medians(rows: list[dict[str, Any]], keys: tuple[str, ...], engines: int) -> dict[str, Any]:
    """Each figure's median over rounds, and the requests decoding per engine on average (Little's law:
    completed x mean time from first token to last / emulated time / decoding engines)."""
    m: dict[str, Any] = {k: _median(rows, k) for k in keys}
    decoding = [
        r["completed"] * (r["mean_e2e_ms"] - r["mean_ttft_ms"]) / 1000.0 / r["emulated_s"] / engines
        for r in rows
        if r.get("mean_e2e_ms") is not None and r.get("mean_ttft_ms") is not None and r["emulated_s"]
    ]
    m["decoding_per_engine"] = statistics.median(decoding) if decoding else None
    roles = rows[0].get("busy_share", {}) if rows else {}
    m["busy_share"] = {role: statistics.median(r["busy_share"][role] for r in rows) for role in roles}
    return m


def _differs(a: float | None, b: float | None, rel: float) -> bool:
    return a is not None and b is not None and abs(a - b) > rel * max(abs(a), abs(b), 1e-12)


def disagreements(case: str, tb: dict[str, Any], dy: dict[str, Any], spread: dict[str, Any],
                  gaps: dict[str, str]) -> list[dict[str, str]]:  # fmt: skip
    """Each figure that disagrees, with the configuration differences that bear on it."""
    design, policy, _ = CASES[case]
    out: list[dict[str, str]] = []
    if tb["completed"] != dy["completed"]:
        out.append({"figure": "completed", "reason": (
            f"testbed: {tb['requests']} requests, {tb['failed']} failed, {tb['rejected']} rejected; Dynamo: "
            f"{dy['requests']} requests, {dy['completed']} completed")})  # fmt: skip
    if (
        tb["prefix_hit_rate"] is not None
        and dy["prefix_hit_rate"] is not None
        and (abs(tb["prefix_hit_rate"] - dy["prefix_hit_rate"]) > HITS_TOL)
    ):
        why = []
        if policy == "kv_aware":
            lo, hi = spread["dynamo_hits"]
            why.append(
                "Dynamo's KV router picks at random among equal-cost workers even at temperature 0 "
                "(run_synthetic_trace_replay's docstring), the testbed's the one with the fewest active "
                f"blocks, then round robin (actors/router.py): Dynamo's rounds hit {lo:.1%}-{hi:.1%}"
            )
        why.append(
            "both count cached prompt tokens over all prompt tokens (the testbed: prefill's "
            "prompt_cached_tokens; Dynamo: prefix_cache_reused_ratio, (input - committed prefill tokens) / "
            "input tokens in its summary), over the same capacity, block size and LRU eviction"
        )
        out.append({"figure": "prefix hits", "reason": "; ".join(why)})
    pricing = [gaps["prefill_context"], gaps["batched_chunks"]]
    if design == "collocated":
        pricing.insert(1, gaps["mixed_pass"])
    else:
        pricing.append(gaps["handoff"])
    if _differs(tb["median_ttft_ms"], dy["median_ttft_ms"], REL_TOL):
        role = "mixed" if design == "collocated" else "prefill"
        busy = tb.get("busy_share", {}).get(role)
        load = gaps["prefill_load"] + (f" (the testbed's were busy {busy:.0%} of the run)" if busy else "")
        out.append({"figure": "TTFT p50", "reason": "; ".join([load, *pricing])})
    if _differs(tb["median_itl_ms"], dy["median_itl_ms"], REL_TOL):
        why = [
            f"{gaps['decode_fidelity']}, so the gap is in what the steps batch: the testbed keeps "
            f"{_fmt(tb['decoding_per_engine'])} requests decoding per engine on average, Dynamo "
            f"{_fmt(dy['decoding_per_engine'])} (completed x (mean E2E - mean TTFT) / emulated time / "
            f"engines; mean TPOT {_fmt(tb['mean_tpot_ms'], '.2f')} against "
            f"{_fmt(dy['mean_tpot_ms'], '.2f')} ms)"
        ]
        why.append(
            "the passes the testbed prices higher are those holding prompt chunks after earlier context "
            "(see TTFT)"
        )
        if design == "collocated":
            why.append(gaps["mixed_pass"] + " (this one the other way)")
        out.append({"figure": "ITL p50", "reason": "; ".join(why)})
    return out


def _fmt(v: Any, spec: str = ",.1f") -> str:
    return "-" if v is None else format(v, spec)


def print_case(case: str, res: dict[str, Any]) -> None:
    tb, dy = res["testbed"], res.get("dynamo")
    rows = [
        ("wall s (median)", _fmt(tb["wall_s"], ".2f"), _fmt(dy and dy["wall_s"], ".2f")),
        ("wall ratio testbed/Dynamo", _fmt(res.get("wall_ratio"), ".1f"), ""),
        ("CPU s (median)", _fmt(tb["cpu_s"], ".2f"), _fmt(dy and dy["cpu_s"], ".2f")),
        ("completed", _fmt(tb["completed"], ",.0f"), _fmt(dy and dy["completed"], ",.0f")),
        ("prefix hits", _fmt(tb["prefix_hit_rate"], ".2%"), _fmt(dy and dy["prefix_hit_rate"], ".2%")),
        ("TTFT p50 ms", _fmt(tb["median_ttft_ms"]), _fmt(dy and dy["median_ttft_ms"])),
        ("ITL p50 ms", _fmt(tb["median_itl_ms"], ".2f"), _fmt(dy and dy["median_itl_ms"], ".2f")),
        (
            "decoding per engine (mean)",
            _fmt(tb["decoding_per_engine"]),
            _fmt(dy and dy["decoding_per_engine"]),
        ),
        ("emulated s", _fmt(tb["emulated_s"]), _fmt(dy and dy["emulated_s"])),
    ]
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{case} ({res['rounds']} rounds)")
        for col in ("figure", "testbed", "Dynamo"):
            table.add_column(col, justify="left" if col == "figure" else "right")
        for row in rows:
            table.add_row(*row)
        Console(width=110).print(table)
    except ImportError:
        print(f"{case} ({res['rounds']} rounds)")
        for row in rows:
            print(f"  {row[0]:<28}{row[1]:>14}{row[2]:>14}")
    for d in res.get("disagreements", []):
        print(f"  {d['figure']} disagrees: {d['reason']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--out", default="runs/bench-dynamo-replay.json")
    p.add_argument("--dynamo-venv", default=str(DYNAMO_VENV))
    p.add_argument("--no-install", action="store_true", help="do not install Dynamo when missing")
    p.add_argument("--side", choices=["testbed", "dynamo"], help=argparse.SUPPRESS)  # a round's subprocess
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--warm", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side == "testbed":
        print(MARK + json.dumps(testbed_side(args.case, args.trace, args.warm)))
        return 0
    if args.side == "dynamo":
        print(MARK + json.dumps(dynamo_side(json.loads(Path(args.spec).read_text()))))
        return 0
    return compare(args)


def compare(args: argparse.Namespace) -> int:
    import numpy as np
    from dynamo_profile import (  # bench/, beside this script
        build_table,
        engine_args,
        prefill_load,
        pricing_gaps,
        table_fidelity,
    )

    from cluster.config_load import load_designs

    cases, trace, out = args.cases.split(","), str(Path(args.trace).resolve()), Path(args.out)
    unknown = set(cases) - set(CASES)
    if unknown:
        raise SystemExit(f"--cases: unknown {', '.join(sorted(unknown))}; allowed: {', '.join(CASES)}")
    rows = [json.loads(line) for line in Path(trace).read_text().splitlines() if line.strip()]
    prompts = [min(r["input_length"], 512 * len(r["hash_ids"])) for r in rows]  # as both loaders clamp
    span_s = (rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1000.0
    tmp = Path(tempfile.mkdtemp(prefix="dynamo-replay-"))
    warm = tmp / "warmup.jsonl"
    warm.write_text("".join(Path(trace).read_text().splitlines(keepends=True)[:WARMUP_LINES]))

    record: dict[str, Any] = {"trace": trace, "preset": PRESET, "rounds": args.rounds, "cases": {}}
    specs: dict[str, dict[str, Any]] = {}
    gaps: dict[str, dict[str, str]] = {}
    built: set[Path] = set()
    for case in cases:  # the tables and Dynamo's arguments, from the config each case resolves to
        design, policy, mode = CASES[case]
        overrides = ["runner.compute=skip", f"router.policy={policy}", f"replay.trace={trace}"]
        cfg = load_designs(PRESET, [design], overrides)[0]
        pools = {"mixed": cfg.pools.mixed, "prefill": cfg.pools.prefill, "decode": cfg.pools.decode}
        roles = ["mixed"] if design == "collocated" else ["prefill", "decode"]
        kwargs: dict[str, Any] = {"router_mode": mode, "trace_block_size": 512}
        for role in roles:
            pool, npz = pools[role], out.with_name(f"{out.stem}.{design}-{role}.npz")
            if npz not in built:
                table = build_table(cfg, pool)
                table.save(npz)
                built.add(npz)
                fid = table_fidelity(cfg, pool, table)
                record.setdefault("profiles", {})[f"{design}-{role}"] = {"npz": str(npz), **fid}
                if role != "decode":  # prefill's passes (P/D: the same GPU and model as decode's)
                    gaps[design] = pricing_gaps(cfg, pool, table, int(np.median(prompts)))
                    ours, theirs = prefill_load(cfg, pool, table, prompts, span_s, pool.replicas)
                    gaps[design]["prefill_load"] = (
                        f"the trace's prompts alone (in {cfg.scheduler.max_num_batched_tokens:,}-token "
                        f"chunks, each after its prompt's earlier ones; no prefix hits) take {ours:.0%} of "
                        f"the {pool.replicas} {role} engines' time over the trace's {span_s:,.0f} s as the "
                        f"testbed prices them, {theirs:.0%} as the table does"
                    )
                    record.setdefault("prefill_load", {})[design] = {"testbed": ours, "table": theirs}
                if role != "prefill":
                    gaps[design]["decode_fidelity"] = (
                        f"the decode table reproduces the testbed's decode-only steps within "
                        f"{fid['decode_max_rel_err']:.2%} (interpolation; prefill's within "
                        f"{fid['prefill_max_rel_err']:.2%})"
                    )
            if design == "collocated":
                kwargs.update(extra_engine_args=engine_args(cfg, pool, npz), num_workers=pool.replicas)
            else:
                kwargs[f"{role}_engine_args"] = engine_args(cfg, pool, npz, role)
                kwargs[f"num_{role}_workers"] = pool.replicas
        specs[case] = {"trace": trace, "warm": str(warm), "kwargs": kwargs}
        (tmp / f"{case}.json").write_text(json.dumps(specs[case]))
    record["pricing_gaps"] = gaps

    py, why = ensure_dynamo(Path(args.dynamo_venv), not args.no_install)
    record["dynamo"] = {"version": DYNAMO_VERSION, "python": str(py) if py else None, "unavailable": why}
    if py is None:
        print(f"Dynamo {DYNAMO_VERSION} unavailable ({why}): testbed figures only.")
    me = str(Path(__file__).resolve())
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {c: {"testbed": [], "dynamo": []} for c in cases}
    for r in range(args.rounds):
        for case in cases:
            tb = _run_side([sys.executable, me, "--side", "testbed", "--case", case, "--trace", trace,
                            "--warm", str(warm)])  # fmt: skip
            runs[case]["testbed"].append(tb)
            line = f"round {r + 1} {case}: testbed {tb['wall_s']:.2f} s"
            if py is not None:
                try:
                    dy = _run_side([str(py), me, "--side", "dynamo", "--spec", str(tmp / f"{case}.json")])
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    print(f"Dynamo {DYNAMO_VERSION} failed to run ({e}): testbed figures only.")
                    py, record["dynamo"]["unavailable"] = None, f"run failed: {e}"
                else:
                    runs[case]["dynamo"].append(dy)
                    line += f", Dynamo {dy['wall_s']:.2f} s"
            print(line, flush=True)

    keys = ("wall_s", "cpu_s", "requests", "completed", "failed", "rejected", "prefix_hit_rate",
            "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "mean_ttft_ms", "mean_e2e_ms", "mean_tpot_ms",
            "emulated_s", "own_wall_time_ms")  # fmt: skip
    for case in cases:
        tbs, dys = runs[case]["testbed"], runs[case]["dynamo"]
        spec = specs[case]["kwargs"]
        engines = spec.get("num_workers") or spec["num_decode_workers"]
        res: dict[str, Any] = {"rounds": len(tbs), "testbed": _medians(tbs, keys, engines), "spec": spec}
        if dys and len(dys) == len(tbs):
            res["dynamo"] = _medians(dys, keys, engines)
            res["wall_ratio"] = statistics.median(
                t["wall_s"] / d["wall_s"] for t, d in zip(tbs, dys, strict=True)
            )
            hits = [d["prefix_hit_rate"] for d in dys]
            spread = {"dynamo_hits": (min(hits), max(hits))}
            res["disagreements"] = disagreements(case, res["testbed"], res["dynamo"], spread,
                                                 gaps[CASES[case][0]])  # fmt: skip
        res["per_round"] = {
            "testbed": tbs,
            "dynamo": [{k: v for k, v in d.items() if k != "summary"} for d in dys],
        }
        if dys:
            res["dynamo_summary_round_1"] = dys[0]["summary"]
        record["cases"][case] = res
        print_case(case, res)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, default=str))
    print(f"wrote {out}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
