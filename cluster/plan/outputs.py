"""What `testbed plan` writes and prints: the ranked table per target, plan.json (inputs, the
search's cost, every row, the explanation), candidates.csv, every replay's per-request results
(results.parquet), each candidate's resolved config, the recommended design as a YAML that
`testbed run --config` runs, and the Pareto plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from cluster.config_load import dump_config
from cluster.load import with_load
from cluster.outcome import clean_json, write_json
from cluster.plan.load_unit import LoadUnit
from cluster.plan.search import BOUNDED, Search
from cluster.plan.space import Candidate
from cluster.plan.table import TERMINAL_OPTIONAL, plan_table
from cluster.plan.verdict import Row, tokens_per_user_s
from dashboards.console import FittedTable
from dashboards.plan_plots import pareto_plots
from dashboards.plan_report import PlanTable, TargetSection, write_plan_report
from workloads.slo_targets import SloTarget


def terminal_table(table: PlanTable) -> FittedTable:
    """`table` for the terminal (`dashboards.console.show` fits it to the terminal's width): where it
    is too narrow, the columns that least decide a ranking are left out first, then headers and names
    wrap at spaces; a value is never cut."""
    out = FittedTable(title=table.title, optional=TERMINAL_OPTIONAL, kept_in="plan.json")
    for header in table.headers:
        left = header in table.text_columns
        wraps = header in table.wrapped  # (and where a terminal is too narrow even so, folds inside a word)
        out.add_column(header, justify="left" if left else "right", no_wrap=not wraps, overflow="fold")
    for row in table.rows:
        out.add_row(*row)
    return out


Verdict = tuple[SloTarget, list[Row], list[str]]
"""A target, its rows best first, and the sentences that explain them."""


def write_replays(out: Path, search: Search) -> None:
    """Each candidate's resolved config, and the results of every replay run so far (all of a finished
    search; those a Ctrl-C left)."""
    (out / "configs").mkdir(parents=True, exist_ok=True)
    for i, cand in enumerate(search.candidates):
        dump_config(cand.cfg, out / "configs" / f"candidate-{i}.yaml")
    frames = [
        p.results.assign(candidate=search.candidates[c].name, load=search.loads[li], seed=s)
        for (c, li, s), p in sorted(search.runs.items())
    ]
    if frames:
        pd.concat(frames, ignore_index=True).to_parquet(out / "results.parquet", index=False)


def write_outputs(
    out: Path, search: Search, verdicts: list[Verdict], info: dict[str, Any], unit: LoadUnit, by_cost: bool
) -> dict[str, Path]:
    """Everything beside the run; returns the recommended YAML's, the plots' and the report's paths
    (by name)."""
    write_replays(out, search)
    table = []
    for target, rows, _ in verdicts:
        table += [{"target": target.name, "rank": i, **_row_dict(r, unit)} for i, r in enumerate(rows, 1)]
    pd.DataFrame(table).to_csv(out / "candidates.csv", index=False)
    paths: dict[str, Path] = {}
    target, rows, _ = verdicts[0]  # the first target decides the recommendation
    best = rows[0]
    if best.goodput_load is not None:
        cand = search.candidates[best.candidate]
        paths["recommended"] = out / "recommended.yaml"
        dump_config(with_load(cand.cfg, best.goodput_load, cand.cfg.seed), paths["recommended"])
    plots = pareto_plots(
        _points(search, target), _per_candidate(rows), target.label, unit.unit, out / "plots"
    )
    paths |= {p.stem: p for _, p in plots}
    write_json(
        out / "plan.json",
        clean_json(
            {
                **info,
                "recommended": str(paths.get("recommended", "")) or None,
                "goodput_unit": unit.unit,
                "targets": [
                    {"target": t.name, "explanation": lines, "rows": [_row_dict(r, unit) for r in rs]}
                    for t, rs, lines in verdicts
                ],
            }
        ),
    )
    sections = [
        TargetSection(t.label, t.name, tuple(lines), plan_table(rs, t, unit, by_cost))
        for t, rs, lines in verdicts
    ]
    per = "dollar" if by_cost else "GPU"
    title = f"testbed plan: {info['source']}, the design with the most goodput per {per}"
    paths["report"] = write_plan_report(out, title, sections, plots, _notes(info, unit))
    return paths


def _per_candidate(rows: list[Row]) -> pd.DataFrame:
    """What the cost plot draws of each candidate, in rank order."""
    best = rows[0]
    return pd.DataFrame(
        [
            {
                "rank": i,
                "name": r.name,
                "goodput_load": r.goodput_load,
                "bounded": r.dropped == BOUNDED,
                "usd_per_hour": r.usd_per_hour,
                "num_gpus": r.num_gpus,
                "recommended": r is best and r.goodput_load is not None,
            }
            for i, r in enumerate(rows, 1)
        ]
    )


def _notes(info: dict[str, Any], unit: LoadUnit) -> list[str]:
    """What the search covered and cost, in words."""
    loads = ", ".join(f"{x:g}" for x in info["loads"])
    seeds = ", ".join(str(s) for s in info["seeds"])
    return [
        f"{info['num_candidates']} candidates ({len(info['left_out'])} left out by the config rules or the "
        f"budget); loads {loads} {unit.unit} ({info['load_key']}); seeds {seeds}; method: {info['method']}",
        f"{info['num_runs']} replays (every candidate at every load and seed: {info['num_runs_exhaustive']}) "
        f"in {info['wall_s']:.1f} s wall",
        *(f"left out: {x['candidate']}: {x['why']}" for x in info["left_out"]),
        f"how far to trust the recommended design's figures: {info['trust']}",
    ]


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


def _row_dict(r: Row, unit: LoadUnit) -> dict[str, Any]:
    """plan.json's and candidates.csv's row: goodput in the load's unit (`goodput_unit`)."""
    return {
        "candidate": r.name,
        "num_gpus": r.num_gpus,
        "usd_per_hour": r.usd_per_hour,
        "goodput_load": r.goodput_load,
        "goodput_per_gpu": r.goodput_per_gpu,
        "goodput_per_usd": r.goodput_per_usd(unit),
        "completed_rps": r.completed_rps,
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
