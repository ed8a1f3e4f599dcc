"""Benchmark: the testbed against public silicon measurements, every row it can express.

aiconfigurator-core ships `systems/silicon_sample.csv`: mean TTFT and TPOT of real vLLM, SGLang and
TRT-LLM deployments at fixed concurrency, aggregated and disaggregated (H100 to GB300). Each row is
built into the deployment it describes (`bench/silicon_rows.py`), its load replayed in virtual mode
(closed loop at the row's concurrency, a warm-up of one concurrency's worth left out, as the benchmarks
that measured it do) on each time model asked for, and the predicted means set beside the measured
ones. Nothing here is fitted: rows whose id's sha256 is 0 mod 5 are the calibration split, marked
in `predictions.csv`, and every error table is over the other four fifths (`--split`).

    .venv/bin/python bench/silicon_validation.py --out runs/silicon [--rows CSV] [--limit N] \\
        [--time-model aggregate operators] [--jobs 2] [--split held-out|calibration|all] [--aiconfigurator]

With `--aiconfigurator`, AIConfigurator's own estimates of the same rows (`bench/silicon_aic.py`,
`aiconfigurator==0.12.0` in a venv of its own) are a third "time model" in every table and plot.

Writes `predictions.csv` (one row per silicon row and time model: predicted TTFT and TPOT means, the
requests replayed, or why the row was skipped), `errors.csv` (median and mean absolute percentage
error and the shares within 10 % and 25 %, by GPU, backend, model, mode and concurrency bucket) and
`report.html` (those tables and the predicted-against-measured plots, log axes, the 25 % band drawn).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from silicon_aic import aic_estimates, ensure_aiconfigurator  # bench/, beside this script
from silicon_rows import Skipped, concurrency, deployment

from cluster.config_load import ConfigError, build_config
from cluster.sweep import run_in_processes
from cluster.virtual import run_virtual
from emulation.silicon_systems import package_dir

TIME_MODELS = ("aggregate", "operators")
REQUESTS_PER_SLOT = 3
"""Requests a closed loop sends per slot after its warm-up (one slot's worth), at least MIN_REQUESTS."""
MIN_REQUESTS = 32
MAX_REPLAY_TOKENS = 20_000_000
"""The most prompt and output tokens one row's replay may carry: a row above (concurrency up to 16,384
at 9k tokens: 600 M) is skipped with its size as the reason, not run out of memory (one took 12 GB)."""
CHUNK = 64
"""Predictions run and written a chunk at a time: a run stopped or crashed keeps what it finished."""
BY = ("system", "backend", "model_path", "mode", "load")


def split_of(row_id: str) -> str:
    """The row's split: calibration where its id's sha256 is 0 mod 5, else held-out."""
    return "calibration" if int(hashlib.sha256(row_id.encode()).hexdigest(), 16) % 5 == 0 else "held-out"


def num_requests(row: dict[str, Any]) -> int:
    slots = concurrency(row) or 1
    return max(MIN_REQUESTS, (REQUESTS_PER_SLOT + 1) * slots)


def predict(job: tuple[dict[str, Any], str]) -> dict[str, Any]:
    """One row on one time model: its predicted means, or why it was skipped."""
    row, time_model = job
    out: dict[str, Any] = {"id": row["id"], "time_model": time_model}
    requests = num_requests(row)
    if requests * (int(row["isl"]) + int(row["osl"])) > MAX_REPLAY_TOKENS:
        return {**out, "skipped": f"replay over the bench's {MAX_REPLAY_TOKENS // 10**6} M-token bound"}
    raw = deployment(row, requests)
    if isinstance(raw, Skipped):
        return {**out, "skipped": raw.reason}
    raw["target"]["time_model"] = time_model
    try:
        cfg = build_config(raw)
    except ConfigError as e:
        return {**out, "skipped": _reason(str(e))}
    start = time.perf_counter()
    summary = run_virtual(cfg, metrics=False).summary
    return {
        **out,
        "ttft_ms": summary["mean_ttft_ms"],
        "tpot_ms": summary["mean_tpot_ms"],
        "requests": summary["completed"],
        "failed": summary["failed"] + summary["rejected"],
        "wall_s": round(time.perf_counter() - start, 3),
    }


def _reason(error: str) -> str:
    """A config error as a countable reason: its field and kind, without the row's own numbers."""
    field, _, rest = error.partition(": ")
    kind = rest.split(";")[0]
    return f"{field.split('=')[0]}: {' '.join(w for w in kind.split() if not any(c.isdigit() for c in w))}"


def errors(table: pd.DataFrame) -> pd.DataFrame:
    """Per group (each of BY, and all rows): rows, and for TTFT and TPOT the median and mean absolute
    percentage errors and the shares within 10 % and 25 %."""
    rows = []
    for time_model, by_tm in table.groupby("time_model"):
        for key in ("all", *BY):
            groups = [("all", by_tm)] if key == "all" else list(by_tm.groupby(key))
            for value, g in groups:
                rec: dict[str, Any] = {"time_model": time_model, "by": key, "group": value, "rows": len(g)}
                for metric in ("ttft", "tpot"):
                    ape = (g[f"{metric}_ms"] / g[f"silicon_{metric}_ms"] - 1).abs() * 100
                    rec[f"{metric}_mdape"] = ape.median()
                    rec[f"{metric}_mape"] = ape.mean()
                    rec[f"{metric}_within_10"] = (ape <= 10).mean()
                    rec[f"{metric}_within_25"] = (ape <= 25).mean()
                rows.append(rec)
    return pd.DataFrame(rows)


def _scatter(table: pd.DataFrame, metric: str) -> str:
    """Predicted against measured, log axes, the +-25 % band; a base64 PNG."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for time_model, g in table.groupby("time_model"):
        ax.scatter(g[f"silicon_{metric}_ms"], g[f"{metric}_ms"], s=8, alpha=0.5, label=str(time_model))
    values = table[[f"silicon_{metric}_ms", f"{metric}_ms"]].to_numpy(dtype=float)
    xs = np.geomspace(max(float(np.nanmin(values)), 1e-3), float(np.nanmax(values)), 50)
    ax.plot(xs, xs, "k-", lw=0.8)
    ax.fill_between(xs, xs * 0.75, xs * 1.25, color="grey", alpha=0.2, label="within 25 %")
    name = metric.upper()
    ax.set(
        xscale="log", yscale="log", xlabel=f"measured mean {name} (ms)", ylabel=f"predicted mean {name} (ms)"
    )
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def write_report(out: Path, predictions: pd.DataFrame, rows: pd.DataFrame, split: str) -> None:
    """`errors.csv` and `report.html` of `predictions` against `rows`' measurements, over `split`."""
    table = predictions.reindex(columns=[*predictions.columns.drop("skipped", errors="ignore"), "skipped"])
    table = table.merge(rows, on="id")
    done = table[table["skipped"].isna()]
    judged = done if split == "all" else done[done["split"] == split]
    errs = errors(judged) if len(judged) else pd.DataFrame()
    errs.to_csv(out / "errors.csv", index=False)
    skipped = table.groupby(["time_model", "skipped"]).size().sort_values(ascending=False)
    ours = done[done["time_model"] != "aiconfigurator"]
    n_rows, n_expressed, n_judged = rows["id"].nunique(), ours["id"].nunique(), judged["id"].nunique()
    share = n_expressed / max(n_rows, 1)
    parts = [
        f"<h1>Silicon validation</h1><p>{n_expressed} of {n_rows} rows expressed ({share:.0%}); errors "
        f"over the {split} split ({n_judged} rows). Nothing fitted.</p>",
        "<h2>Errors</h2>" + errs.to_html(index=False, float_format=lambda x: f"{x:.3g}"),
        "<h2>Skipped, by reason</h2>" + skipped.to_frame("rows").to_html(),
    ]
    for metric in ("ttft", "tpot") if len(judged) else ():
        parts.append(f'<h2>{metric.upper()}</h2><img src="data:image/png;base64,{_scatter(judged, metric)}">')
    head = "<head><meta charset='utf-8'><title>silicon validation</title></head>"
    (out / "report.html").write_text(f"<html>{head}<body>{''.join(parts)}</body></html>")
    reasons = "; ".join(f"{model}: {reason} ({n})" for (model, reason), n in skipped.items())
    print(f"{n_expressed} of {n_rows} rows expressed; skipped: {reasons or 'none'}")
    if len(errs):
        print(errs[errs["by"] == "all"].to_string(index=False))


def aiconfigurator(rows: pd.DataFrame, jobs: int) -> pd.DataFrame:
    """AIConfigurator's estimates of `rows` as predictions of a time model named `aiconfigurator`
    (`bench/silicon_aic.py`); every row skipped, with the reason, where it cannot be installed."""
    py, why = ensure_aiconfigurator()
    if py is None:
        return pd.DataFrame({"id": rows["id"], "time_model": "aiconfigurator", "skipped": why})
    est = aic_estimates(rows.to_dict("records"), py, jobs)
    renamed = {
        "aic_ttft_ms": "ttft_ms",
        "aic_tpot_ms": "tpot_ms",
        "aic_skipped": "skipped",
        "aic_wall_s": "wall_s",
    }
    return est.rename(columns=renamed).assign(time_model="aiconfigurator")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=Path, help="a CSV of silicon_sample.csv's columns (default: the package's)")
    p.add_argument("--time-model", nargs="+", default=list(TIME_MODELS), choices=TIME_MODELS)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--limit", type=int, help="the first N rows only (after --split)")
    p.add_argument("--split", default="held-out", choices=("held-out", "calibration", "all"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--aiconfigurator",
        action="store_true",
        help="set AIConfigurator's own estimates beside (aiconfigurator==0.12.0, in a venv of its own)",
    )
    args = p.parse_args()
    source = args.rows or (package_dir() / "systems" / "silicon_sample.csv" if package_dir() else None)
    if source is None:
        print("error: --rows: aiconfigurator-core is not installed, so give a CSV", file=sys.stderr)
        return 2
    rows = pd.read_csv(source)
    rows["split"] = rows["id"].map(split_of)
    rows["load"] = [f"c{concurrency(r) or '?'}" for r in rows.to_dict("records")]
    chosen = rows if args.split == "all" else rows[rows["split"] == args.split]
    if args.limit:
        chosen = chosen.head(args.limit)
    jobs = [(row, tm) for row in chosen.to_dict("records") for tm in args.time_model]
    start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    done: list[dict[str, Any]] = []
    for i in range(0, len(jobs), CHUNK):
        done += run_in_processes(predict, jobs[i : i + CHUNK], args.jobs)
        pd.DataFrame(done).to_csv(args.out / "predictions.csv", index=False)
    predictions = pd.DataFrame(done)
    if args.aiconfigurator:
        predictions = pd.concat([predictions, aiconfigurator(chosen, args.jobs)], ignore_index=True)
        predictions.to_csv(args.out / "predictions.csv", index=False)
    print(f"{len(jobs)} predictions in {time.perf_counter() - start:.0f} s wall")
    keep = ["id", "split", "load", *BY[:4], "silicon_ttft_ms", "silicon_tpot_ms"]
    write_report(args.out, predictions, chosen[list(dict.fromkeys(keep))], args.split)
    return 0


if __name__ == "__main__":
    sys.exit(main())
