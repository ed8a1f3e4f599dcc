"""`testbed plan`: search a design space for the design with the most goodput per GPU (or per
dollar) under SLO targets, with virtual replays of the workload. See docs/plan.md."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster.cli_args import add_command
from cluster.cli_run import out_dir, overrides
from cluster.config_load import ConfigError, load_designs
from cluster.interrupt import Interrupted
from cluster.load import closed_loop_refusal, load_key
from cluster.outcome import trust_for
from cluster.plan.floors import floors_s
from cluster.plan.load_unit import LOAD_UNITS, LoadUnit
from cluster.plan.outputs import Verdict, terminal_table, write_outputs, write_replays
from cluster.plan.prices import PriceError, parse_prices
from cluster.plan.search import Outcome, Search
from cluster.plan.shapes import parse_shapes, shapes_for
from cluster.plan.space import Axis, Candidate, build_space, parse_axis
from cluster.plan.table import plan_table
from cluster.plan.verdict import build_row, explain, rank
from workloads.slo import DEFAULT_PERCENTILE, GRAMMAR, LABELS, SloError, duration_label
from workloads.slo_targets import SloTarget, parse_slo_target

DEFAULT_SLO = "ttft:p90<=2s,tpot:p90<=50ms"
DEFAULT_LOADS = {
    "workload.rate": "0.1,0.2,0.3,0.4,0.5,0.6,0.8,1.0,1.2,1.5,2.0",
    "replay.speedup": "0.5,1,1.5,2,3,4,6,8",
    "multi_turn.conversation_rate": "0.05,0.1,0.2,0.3,0.4,0.6,0.8,1.0",
}
ERRORS = (SloError, PriceError)


def add_plan_parser(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    config_args: Callable[[argparse.ArgumentParser, str], None],
) -> None:
    p = add_command(sub, "plan")
    config_args(p, "comma-separated designs of the preset to search from (default: all)")
    p.add_argument(
        "--slo",
        action="append",
        metavar="TERMS",
        help=f"an SLO target: comma-joined {GRAMMAR} terms over {', '.join(LABELS)}; a term without "
        f"a percentile bounds the p{DEFAULT_PERCENTILE:g} (ttft<=2s is ttft:p{DEFAULT_PERCENTILE:g}<=2s), "
        f"as configs' slos (default: {DEFAULT_SLO}); repeat for more (the first decides the recommendation)",
    )
    p.add_argument(
        "--vary",
        action="append",
        metavar="[DESIGN:]KEY=V1,V2",
        help="an axis of the space: each value of a config field (only DESIGN's, if given)",
    )
    p.add_argument("--loads", help="the load grid, ascending: req/s (a trace: speedups); default by workload")
    p.add_argument("--seeds", type=int, default=3, help="seeds a final answer pools")
    p.add_argument(
        "--shapes",
        help="engine counts: cN (collocated), pPdD (P/D), comma-separated, or auto (all within --max-gpus)",
    )
    p.add_argument("--max-gpus", type=int, help="the GPU budget: larger candidates are left out")
    p.add_argument(
        "--price", action="append", metavar="GPU=USD", help="a GPU's price per hour (overrides the table)"
    )
    p.add_argument("--rank", choices=["gpu", "cost"], default="gpu", help="goodput per GPU or per dollar")
    p.add_argument("--trace", help="replay this trace (any format `testbed replay` reads) as the workload")
    p.add_argument("--num-requests", type=int, help="synthetic workloads: requests per replay")
    p.add_argument(
        "--exhaustive", action="store_true", help="replay every candidate, load and seed (reference)"
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count(), help="parallel processes")
    p.add_argument("--out", help="run directory (default: runs/<time>-plan)")


def parse_loads(text: str) -> list[float]:
    try:
        loads = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--loads={text!r}: expected comma-separated numbers, e.g. 0.2,0.4,0.8") from None
    if not loads or any(not (x > 0 and math.isfinite(x)) for x in loads) or loads != sorted(set(loads)):
        raise ConfigError(f"--loads={text!r}: must be distinct numbers > 0 in ascending order")
    return loads


def cmd_plan(args: argparse.Namespace) -> int:
    targets = [parse_slo_target(t) for t in args.slo or [DEFAULT_SLO]]
    prices = parse_prices(args.price or [])
    for flag, value in (("--seeds", args.seeds), ("--jobs", args.jobs), ("--max-gpus", args.max_gpus)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag}={value}: must be >= 1")
    source = args.config or args.preset
    pins = (["workload.kind=trace"] if args.trace else []) + overrides(args)
    candidates, left_out, axes = _space(args, source, pins)
    if (problem := closed_loop_refusal(candidates[0].cfg, "plan")) is not None:
        raise ConfigError(problem)
    key = load_key(candidates[0].cfg)
    loads = parse_loads(args.loads or DEFAULT_LOADS[key])
    by_cost = args.rank == "cost"
    for cand in candidates if by_cost else []:
        missing = [g for g in cand.gpus if g not in prices]
        if missing:
            raise ConfigError(
                f"--rank cost: GPU {missing[0]!r} ({cand.name}) has no price; give --price {missing[0]}=USD"
            )
    seeds = [candidates[0].cfg.seed + i for i in range(args.seeds)]
    num_runs = [0]

    def on_runs(n: int) -> None:
        num_runs[0] += n
        print(f"  replaying {n} point(s) ({num_runs[0]} so far)", file=sys.stderr, flush=True)

    search = Search(candidates, loads, seeds, args.jobs, on_runs)
    start = time.perf_counter()
    out = out_dir(args, "plan")
    verdicts = []
    try:
        for target in targets:
            outcomes = _search(search, target, prices, by_cost, args.exhaustive)
            rows = rank([build_row(search, target, c, o, prices, by_cost) for c, o in outcomes.items()])
            verdicts.append((target, rows, explain(rows, target, search, LOAD_UNITS[key], by_cost)))
    except KeyboardInterrupt:  # the replays run so far, with every candidate's config; no verdict
        write_replays(out, search)
        raise Interrupted(len(search.runs), None, out, unit="replays") from None
    best = verdicts[0][1][0]
    info = {
        "source": source,
        "pins": pins,
        "axes": [{"key": a.key, "values": list(a.values), "design": a.design} for a in axes],
        "shapes": args.shapes,
        "load_key": key,
        "loads": loads,
        "seeds": seeds,
        "rank": args.rank,
        "prices_usd_per_gpu_hour": prices,
        "max_gpus": args.max_gpus,
        "method": "exhaustive" if args.exhaustive else "bisection + successive halving",
        "num_candidates": len(candidates),
        "left_out": [{"candidate": n, "why": w} for n, w in left_out],
        "num_runs": len(search.runs),
        "num_runs_exhaustive": len(candidates) * len(loads) * len(seeds),
        "wall_s": time.perf_counter() - start,
        "recommended_ray_units": candidates[best.candidate].ray_units if best.score is not None else None,
        "trust": trust_for(candidates[best.candidate].cfg).line,
    }
    paths = write_outputs(out, search, verdicts, info, LOAD_UNITS[key], by_cost)
    _print(verdicts, info, paths, out, LOAD_UNITS[key], by_cost)
    return 0


def _space(
    args: argparse.Namespace, source: str, pins: list[str]
) -> tuple[list[Candidate], list[tuple[str, str]], list[Axis]]:
    """The candidates (the source's designs, their shapes, the axes), those left out, the axes."""
    requested = [d for d in (args.design or "").split(",") if d] or None
    first = load_designs(source, requested, pins)
    designs = [c.design for c in first]
    axes = [parse_axis(a, designs) for a in args.vary or []]
    for axis in axes:  # a value no design takes is a typo, not a combination the rules refuse
        mine = [d for d in designs if axis.design in (None, d)]
        for value in axis.values:
            errors = []
            for design in mine:
                try:
                    load_designs(source, [design], [*pins, f"{axis.key}={value}"])
                except ConfigError as e:
                    errors.append(str(e))
            if len(errors) == len(mine):
                raise ConfigError(f"--vary {axis.key}={value}: no design takes it ({errors[0]})")
    shapes = None
    if args.shapes is not None:
        wanted = parse_shapes(args.shapes, args.max_gpus)
        shapes = {c.design: shapes_for(c, wanted, args.max_gpus) for c in first}
    candidates, left_out = build_space(source, designs, pins, axes, args.max_gpus, shapes)
    return candidates, left_out, axes


def _print(
    verdicts: list[Verdict],
    info: dict[str, Any],
    paths: dict[str, Path],
    out: Path,
    unit: LoadUnit,
    by_cost: bool,
) -> None:
    """Per target its table, then its verdict in sentences; what was left out; where it all is."""
    from dashboards.console import show

    for t, rows, lines in verdicts:
        show(terminal_table(plan_table(rows, t, unit, by_cost)))
        print(f"Target {t.label} (--slo {t.name}):\n  " + "\n  ".join(lines) + "\n")
    for item in info["left_out"]:
        print(f"left out: {item['candidate']}: {item['why']}")
    print(
        f"{info['num_candidates']} candidates, {info['num_runs']} replays (every candidate at every load and "
        f"seed: {info['num_runs_exhaustive']}) in {info['wall_s']:.1f} s wall; run directory: {out}"
    )
    print(f"report: {paths['report']}")
    if "recommended" in paths:
        units = ", ".join(f"{k}: {v}" for k, v in info["recommended_ray_units"].items())
        print(f"live, it needs a Ray cluster offering {{{units}}} resource units (docs/live-and-ray-up.md)")
        print(f"recommended design: {paths['recommended']}  (testbed run --config {paths['recommended']})")
    print(f"how far to trust these figures: {info['trust']}")


def _search(
    search: Search, target: SloTarget, prices: dict[str, float], by_cost: bool, exhaustive: bool
) -> dict[int, Outcome]:
    """Each candidate's outcome: floors first (unless exhaustive), then the search."""
    members, outcomes = [], {}
    for c, cand in enumerate(search.candidates):
        missed = None if exhaustive else _floor_miss(cand, target)
        if missed:
            outcomes[c] = Outcome(-1, (), dropped=missed)
        else:
            members.append(c)
    if exhaustive:
        found = search.exhaustive(target, members)
        seeds = tuple(search.seeds)
        return {**outcomes, **{c: Outcome(g, seeds) for c, g in found.items()}}

    def score(c: int, g: int) -> float:
        return search.candidates[c].score(search.loads[g], prices, by_cost) if g >= 0 else -1.0

    return {**outcomes, **search.halving(target, members, score)}


def _floor_miss(cand: Candidate, target: SloTarget) -> str | None:
    floors = floors_s(cand.cfg)
    if floors is None:
        return None
    for term in target.terms:
        floor = floors.get(term.metric)
        if floor is not None and floor > term.bound_s:
            alone, bound = duration_label(floor, 3), duration_label(term.bound_s)
            return f"floor: {LABELS[term.metric]} alone {alone} > {bound}"
    return None
