"""`testbed plan`: search a design space for the design with the most goodput per GPU (or per
dollar) under SLO targets, with virtual replays of the workload. See docs/plan.md."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable

from cluster.cli_run import out_dir, overrides
from cluster.config_load import ConfigError, load_designs
from cluster.plan.floors import floors_s
from cluster.plan.outputs import plan_table, write_outputs
from cluster.plan.prices import PriceError, parse_prices
from cluster.plan.search import Outcome, Search
from cluster.plan.shapes import parse_shapes, shapes_for
from cluster.plan.space import Candidate, build_space, load_key, parse_axis
from cluster.plan.verdict import build_row, explain, rank
from workloads.slo_targets import SloTarget, SloTargetError, parse_slo_target

DEFAULT_SLO = "ttft:p90<=2s,tpot:p90<=50ms"
DEFAULT_LOADS = {
    "workload.rate": "0.1,0.2,0.3,0.4,0.5,0.6,0.8,1.0,1.2,1.5,2.0",
    "replay.speedup": "0.5,1,1.5,2,3,4,6,8",
    "multi_turn.conversation_rate": "0.05,0.1,0.2,0.3,0.4,0.6,0.8,1.0",
}
LOAD_UNITS = {
    "workload.rate": "req/s",
    "replay.speedup": "x trace speed",
    "multi_turn.conversation_rate": "conv/s",
}
ERRORS = (SloTargetError, PriceError)


def add_plan_parser(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    config_args: Callable[[argparse.ArgumentParser, str], None],
) -> None:
    p = sub.add_parser("plan", help="search designs for the most goodput per GPU or dollar under SLOs")
    config_args(p, "comma-separated designs of the preset to search from (default: all)")
    p.add_argument(
        "--slo",
        action="append",
        help=f"an SLO target, metric:pNN<=BOUND terms (default: {DEFAULT_SLO}); "
        "repeat for more (the first decides the recommendation)",
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
    if args.seeds < 1:
        raise ConfigError(f"--seeds={args.seeds}: must be >= 1")
    if args.max_gpus is not None and args.max_gpus < 1:
        raise ConfigError(f"--max-gpus={args.max_gpus}: must be >= 1")
    source = args.config or args.preset
    pins = (["workload.kind=trace"] if args.trace else []) + overrides(args)
    requested = [d for d in (args.design or "").split(",") if d] or None
    first = load_designs(source, requested, pins)
    axes = [parse_axis(a, [c.design for c in first]) for a in args.vary or []]
    shapes = None
    if args.shapes:
        wanted = parse_shapes(args.shapes, args.max_gpus)
        shapes = {c.design: shapes_for(c, wanted, args.max_gpus) for c in first}
    candidates, left_out = build_space(source, [c.design for c in first], pins, axes, args.max_gpus, shapes)
    key = load_key(candidates[0].cfg)
    loads = parse_loads(args.loads or DEFAULT_LOADS[key])
    unit = LOAD_UNITS[key]
    by_cost = args.rank == "cost"
    if by_cost:
        for cand in candidates:
            missing = [g for g in cand.gpus if g not in prices]
            if missing:
                raise ConfigError(
                    f"--rank cost: GPU {missing[0]!r} ({cand.name}) has no price; "
                    f"give --price {missing[0]}=USD"
                )
    seeds = [candidates[0].cfg.seed + i for i in range(args.seeds)]
    num_runs = [0]

    def on_runs(n: int) -> None:
        num_runs[0] += n
        print(f"  replaying {n} point(s) ({num_runs[0]} so far)", file=sys.stderr, flush=True)

    search = Search(candidates, loads, seeds, args.jobs, on_runs)
    start = time.perf_counter()
    verdicts = []
    for target in targets:
        outcomes = _search(search, target, prices, by_cost, args.exhaustive)
        rows = rank([build_row(search, target, c, o, prices) for c, o in outcomes.items()], by_cost)
        verdicts.append((target, rows, explain(rows, target, search, unit, by_cost)))
    wall_s = time.perf_counter() - start
    out = out_dir(args, "plan")
    num_exhaustive = len(candidates) * len(loads) * len(seeds)
    info = {
        "source": source,
        "pins": pins,
        "axes": [{"key": a.key, "values": list(a.values), "design": a.design} for a in axes],
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
        "num_runs_exhaustive": num_exhaustive,
        "wall_s": wall_s,
        "recommended_ray_units": candidates[verdicts[0][1][0].candidate].ray_units,
    }
    paths = write_outputs(out, search, verdicts, info)
    from dashboards.console import show

    show(*(plan_table(rows, t, unit, by_cost) for t, rows, _ in verdicts))
    for t, _, lines in verdicts:
        print(f"\n{t.name}:\n  " + "\n  ".join(lines))
    for name, why in left_out:
        print(f"left out: {name}: {why}")
    print(
        f"\n{len(candidates)} candidates, {len(search.runs)} replays (exhaustive: {num_exhaustive}) in "
        f"{wall_s:.1f} s wall; run directory: {out}"
    )
    print(f"report: {paths['report']}")
    if "recommended" in paths:
        units = ", ".join(f"{k}: {v}" for k, v in info["recommended_ray_units"].items())
        print(f"live, it needs a Ray cluster offering {{{units}}} resource units (docs/live-and-ray-up.md)")
        print(f"recommended design: {paths['recommended']}  (testbed run --config {paths['recommended']})")
    return 0


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
        cand = search.candidates[c]
        per = sum(prices[gpu] * n for gpu, n in cand.gpus.items()) if by_cost else cand.num_gpus
        return search.loads[g] / per if g >= 0 else -1.0

    return {**outcomes, **search.halving(target, members, score)}


def _floor_miss(cand: Candidate, target: SloTarget) -> str | None:
    floors = floors_s(cand.cfg)
    if floors is None:
        return None
    for term in target.terms:
        floor = floors.get(term.metric)
        if floor is not None and floor > term.bound_s:
            return f"floor: {term.metric} {floor * 1000:.0f} ms alone > {term.bound_s * 1000:g} ms"
    return None
