"""Check: a change that only makes the testbed faster leaves every run it replays exactly as it was.

    .venv/bin/python bench/same_runs.py --save runs/same-runs.before.json   # on the build before
    .venv/bin/python bench/same_runs.py --check runs/same-runs.before.json  # on the change
    ... [--set target.time_model=operators]   # every run with this setting too (both builds)

Replays, in virtual mode with compute skip, the designs, routers and traces speed work is checked on:
the guide sweep's three designs at two rates and two seeds; the Mooncake conversation window on the
agentic-h200 preset, collocated and P/D, round robin and KV-aware; the WEKA Claude Code sessions on its
collocated design with every router; the hybrid preset's designs (state handoff); a MoE and an AFD
preset's designs. Per run it records the summary, every engine's report (counters, scheduler stats), a
digest of each column of the per-request results and a digest of every role's final Prometheus
exposition (less the `_created` series, which are wall-clock stamps). `--check` prints each figure that
differs and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cluster.config_load import available_presets, load_designs, needs_trace
from cluster.outcome import RunOutput
from cluster.virtual import run_virtual
from emulation.config import TestbedConfig

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
MOONCAKE = TRACES / "mooncake_fast25" / "conversation_trace.window_0s_1200s.jsonl"
WEKA = TRACES / "weka_claude_code"
SKIP = "runner.compute=skip"


def configs(extra: list[str]) -> Iterator[tuple[str, TestbedConfig]]:
    """(run name, config) for every run checked (those named `.../no-metrics` record none, as a
    sweep's points), each with the `extra` settings too."""
    skip = [SKIP, *extra]
    for rate in (0.4, 1.5):
        for seed in (0, 1):
            sets = [*skip, "workload.num_requests=100", f"workload.rate={rate}", f"seed={seed}"]
            for cfg in load_designs("guide-l40s", None, sets):
                yield f"guide/{cfg.design}/rate={rate}/seed={seed}", cfg
                if seed == 1:
                    yield f"guide/{cfg.design}/rate={rate}/seed={seed}/no-metrics", cfg
    for design in ("collocated", "pd"):
        for policy in ("round_robin", "kv_aware"):
            sets = [*skip, f"replay.trace={MOONCAKE}", f"router.policy={policy}"]
            yield f"mooncake/{design}/{policy}", load_designs("agentic-h200", [design], sets)[0]
    for policy in ("kv_aware", "kv_estimated", "session_affinity", "round_robin"):
        sets = [*skip, f"replay.trace={WEKA}", f"router.policy={policy}"]
        yield f"weka/collocated/{policy}", load_designs("agentic-h200", ["collocated"], sets)[0]
    for cfg in load_designs("qwen3-next-h200", None, [*skip, "workload.num_requests=60"]):
        yield f"hybrid/{cfg.design}", cfg
    for preset in ("qwen3-30b-a3b-h100", "deepseek-v3-afd-h800"):  # MoE and AFD steps' work
        for cfg in load_designs(preset, None, [*skip, "workload.num_requests=200"]):
            yield f"moe/{preset}/{cfg.design}", cfg
    covered = ("guide-l40s", "agentic-h200", "qwen3-next-h200", "qwen3-30b-a3b-h100", "deepseek-v3-afd-h800")
    for preset in (p for p in available_presets() if p not in covered):  # every other preset, briefly
        sets = [*skip, "workload.num_requests=60"]
        if needs_trace(preset):
            sets += [f"replay.trace={MOONCAKE}", "replay.window_s=[0, 60]"]
        for cfg in load_designs(preset, None, sets):
            yield f"preset/{preset}/{cfg.design}", cfg


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(out: RunOutput) -> dict[str, Any]:
    """What must not move: summary, engine reports, per-request columns, metrics."""
    df = out.results.sort_values("request_id").reset_index(drop=True)
    metrics = {
        actor: _digest("\n".join(line for line in text.splitlines() if "_created" not in line))
        for actor, text in sorted(out.metrics.items())
    }
    engines = {k: dataclasses.asdict(r) for k, r in out.engine_reports.items()}
    return {
        "summary": json.loads(json.dumps(out.summary, default=str)),
        "engines": json.loads(json.dumps(engines, default=str)),
        "results": {c: _digest(df[c].to_csv(index=False)) for c in df.columns},
        "metrics": metrics,
    }


def differences(before: Any, after: Any, where: str = "") -> Iterator[str]:
    """Every leaf that differs, by its path (a figure the record does not have is an addition, not a
    difference: `additions`)."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            if key in before:
                yield from differences(before[key], after.get(key), f"{where}/{key}")
    elif before != after and not (before != before and after != after):  # (NaN is NaN)
        yield f"{where}: {before!r} -> {after!r}"


def additions(before: Any, after: Any, where: str = "") -> Iterator[str]:
    """Every figure of `after` the record `before` does not have, by its path."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(after):
            yield from (
                additions(before[key], after[key], f"{where}/{key}") if key in before else [f"{where}/{key}"]
            )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save", metavar="FILE", help="record this build's runs")
    mode.add_argument("--check", metavar="FILE", help="compare this build's runs with a record")
    p.add_argument("--only", default="", help="run names starting with this prefix only")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="every run with it too")
    args = p.parse_args()
    runs: dict[str, Any] = {}
    for name, cfg in configs(args.set):
        if not name.startswith(args.only):
            continue
        start = time.perf_counter()
        runs[name] = fingerprint(run_virtual(cfg, metrics=not name.endswith("/no-metrics")))
        print(f"{name}: {time.perf_counter() - start:.1f} s", flush=True)
    if args.save:  # (with --only: into the record there, the other runs kept)
        path = Path(args.save)
        kept = json.loads(path.read_text()) if args.only and path.exists() else {}
        path.write_text(json.dumps({**kept, **runs}, indent=1, sort_keys=True) + "\n")
        return 0
    before = json.loads(Path(args.check).read_text())
    diffs = [d for name in runs for d in differences(before.get(name), runs[name], name)]
    added = [a for name in runs for a in additions(before.get(name), runs[name], name)]
    for line in diffs:
        print(line)
    if added:
        print(
            f"{len(added)} figures added (not in the record): "
            + ", ".join(sorted({a.rsplit("/", 1)[-1] for a in added}))
        )
    print(f"{len(runs)} runs: " + ("identical" if not diffs else f"{len(diffs)} figures differ"))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
