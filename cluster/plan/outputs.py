"""What `testbed plan` writes and prints: the ranked table per target, plan.json (inputs, the
search's cost, every row, the explanation), candidates.csv, every replay's per-request results
(results.parquet), each candidate's resolved config, the recommended design as a YAML that
`testbed run --config` runs, and the Pareto plots."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
from rich.table import Table

from cluster.config_load import dump_config
from cluster.outcome import clean_json, write_json
from cluster.plan.search import BOUNDED, Search
from cluster.plan.space import Candidate, with_load
from cluster.plan.verdict import Row, tokens_per_user_s
from dashboards.plan_plots import pareto_plots
from dashboards.plan_report import write_plan_report
from workloads.slo_targets import SloTarget


def plan_table(rows: list[Row], target: SloTarget, load_unit: str, by_cost: bool) -> Table:
    t = Table(title=f"{target.name}: ranked by goodput per {'dollar' if by_cost else 'GPU'}")
    priced = all(r.usd_per_hour is not None for r in rows)
    columns = [
        "#",
        "candidate",
        "GPUs",
        f"goodput ({load_unit})",
        "req/s/GPU",
        *(["req/$"] if priced else []),
    ]
    columns += ["tok/s/GPU", "tok/s/user", "attained", "binds", "busiest pool", "handoff/TTFT", "dropped"]
    for col in columns:
        left = col in ("candidate", "binds", "busiest pool", "dropped")
        t.add_column(col, justify="left" if left else "right", no_wrap=col == "candidate")
    for i, r in enumerate(rows, 1):
        binds = f"{r.binding} {r.binding_ratio:.2f}x" if r.binding and r.binding_ratio is not None else "-"
        busy = f"{r.bottleneck} {r.busy_share:.0%}" if r.bottleneck and r.busy_share is not None else "-"
        t.add_row(
            str(i),
            r.name,
            str(r.num_gpus),
            _goodput(r),
            _num(r.rps_per_gpu),
            *([_num(r.requests_per_usd)] if priced else []),
            _num(r.output_tps_per_gpu),
            _num(r.tps_per_user),
            f"{r.attainment:.0%}" if r.attainment is not None else "-",
            binds,
            busy,
            f"{r.handoff_share:.0%}" if r.handoff_share is not None else "-",
            r.dropped or "",
        )
    return t


def write_outputs(
    out: Path,
    search: Search,
    verdicts: list[tuple[SloTarget, list[Row], list[str]]],
    info: dict[str, Any],
) -> dict[str, Path]:
    """Everything beside the run; returns the recommended YAML's and the plots' paths (by name)."""
    (out / "configs").mkdir(parents=True, exist_ok=True)
    for i, cand in enumerate(search.candidates):
        dump_config(cand.cfg, out / "configs" / f"candidate-{i}.yaml")
    frames = [
        p.results.assign(candidate=search.candidates[c].name, load=search.loads[li], seed=s)
        for (c, li, s), p in sorted(search.runs.items())
    ]
    if frames:
        pd.concat(frames, ignore_index=True).to_parquet(out / "results.parquet", index=False)
    table = []
    for target, rows, _ in verdicts:
        table += [{"target": target.name, "rank": i, **_row_dict(r)} for i, r in enumerate(rows, 1)]
    pd.DataFrame(table).to_csv(out / "candidates.csv", index=False)
    paths: dict[str, Path] = {}
    target, rows, _ = verdicts[0]  # the first target decides the recommendation
    best = rows[0]
    if best.goodput_load is not None:
        cand = search.candidates[best.candidate]
        paths["recommended"] = out / "recommended.yaml"
        dump_config(with_load(cand.cfg, best.goodput_load, cand.cfg.seed), paths["recommended"])
    points = _points(search, target)
    per_candidate = pd.DataFrame(
        [
            {
                "name": r.name,
                "goodput_rps": r.goodput_rps,
                "usd_per_hour": r.usd_per_hour,
                "num_gpus": r.num_gpus,
                "recommended": r is best and r.goodput_load is not None,
            }
            for r in rows
        ]
    )
    for p in pareto_plots(points, per_candidate, target.name, out / "plots"):
        paths[p.stem] = p
    write_json(
        out / "plan.json",
        clean_json(
            {
                **info,
                "recommended": str(paths.get("recommended", "")) or None,
                "targets": [
                    {"target": t.name, "explanation": lines, "rows": [_row_dict(r) for r in rs]}
                    for t, rs, lines in verdicts
                ],
            }
        ),
    )
    notes = [
        f"{info['num_candidates']} candidates ({len(info['left_out'])} left out), loads {info['loads']} "
        f"({info['load_key']}), seeds {info['seeds']}; {info['method']}",
        f"{info['num_runs']} replays (every candidate x load x seed: {info['num_runs_exhaustive']}) in "
        f"{info['wall_s']:.1f} s wall",
        *(f"left out: {x['candidate']}: {x['why']}" for x in info["left_out"]),
    ]
    tables = [(t.name, lines, pd.DataFrame([_row_dict(r) for r in rs])) for t, rs, lines in verdicts]
    plots = [paths[k] for k in ("pareto_tokens", "goodput_cost") if k in paths]
    paths["report"] = write_plan_report(out, f"testbed plan: {info['source']}", tables, plots, notes)
    return paths


def _points(search: Search, target: SloTarget) -> pd.DataFrame:
    """One row per replay: its candidate, throughput per GPU and per user, and whether it met."""
    rows = []
    for (c, li, s), p in search.runs.items():
        cand: Candidate = search.candidates[c]
        ok = p.results[p.results["ok"]]
        per_user = tokens_per_user_s(ok)
        if p.duration_s <= 0 or per_user is None:
            continue
        rows.append(
            {
                "candidate": cand.name,
                "load": search.loads[li],
                "seed": s,
                "tps_per_user": per_user,
                "tps_per_gpu": float(ok["num_output_tokens"].sum()) / p.duration_s / cand.num_gpus,
                "met": target.met(p.results),
            }
        )
    return pd.DataFrame(rows, columns=["candidate", "load", "seed", "tps_per_user", "tps_per_gpu", "met"])


def _row_dict(r: Row) -> dict[str, Any]:
    return {
        "candidate": r.name,
        "num_gpus": r.num_gpus,
        "usd_per_hour": r.usd_per_hour,
        "goodput_load": r.goodput_load,
        "goodput_rps": r.goodput_rps,
        "rps_per_gpu": r.rps_per_gpu,
        "requests_per_usd": r.requests_per_usd,
        "output_tps_per_gpu": r.output_tps_per_gpu,
        "tps_per_user": r.tps_per_user,
        "slo_attainment": r.attainment,
        "binding": r.binding,
        "binding_ratio": r.binding_ratio,
        "bottleneck": r.bottleneck,
        "busy_share": r.busy_share,
        "handoff_share_of_ttft": r.handoff_share,
        "num_seeds": r.num_seeds,
        "dropped": r.dropped,
        "goodput_under": r.goodput_under,
        **{f"{k}_s": v for k, v in r.values_s.items()},
    }


def _goodput(r: Row) -> str:
    """The goodput load; a bounded candidate's open bracket (`0.4 to < 0.8`, `< 0.8`, `>= 0.4`)."""
    if r.dropped == BOUNDED:
        low = f"{r.goodput_load:g}" if r.goodput_load is not None else None
        if r.goodput_under is None:
            return f">= {low}" if low else "not probed"
        return f"{low} to < {r.goodput_under:g}" if low else f"< {r.goodput_under:g}"
    return _num(r.goodput_load) if r.goodput_load is not None else "none"


def _num(x: float | None) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"
