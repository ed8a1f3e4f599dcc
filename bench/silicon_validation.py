"""Benchmark: the testbed against public silicon measurements, every row it can express.

aiconfigurator-core ships `systems/silicon_sample.csv`: mean TTFT and TPOT of real vLLM, SGLang and
TRT-LLM deployments at fixed concurrency, aggregated and disaggregated (H100 to GB300). Each row is
built into the deployment it describes (`bench/silicon_rows.py`), its load replayed in virtual mode
(closed loop at the row's concurrency, lengths and the first wave's weight as the benchmark that
measured it had them: `silicon_rows`, `benchmark_means`) on each time model asked for, and the
predicted means set beside the measured ones. Nothing here is fitted: rows whose id's sha256 is 0 mod
5 are the calibration split (where the measured model's one constant, its CPU time a step, was set),
and every error table is over the other four fifths (`--split`).

    .venv/bin/python bench/silicon_validation.py --out runs/silicon [--rows CSV] [--limit N] \\
        [--time-model aggregate operators measured] [--jobs 2] [--split held-out|calibration|all] \\
        [--aiconfigurator] [--report-only]

With `--aiconfigurator`, AIConfigurator's own estimates of the same rows (`bench/silicon_aic.py`,
`aiconfigurator==0.12.0` in a venv of its own) are a third "time model" in every table and plot.

Writes `predictions.csv` (one row per silicon row and time model: predicted TTFT and TPOT means, the
requests replayed, or why the row was skipped), `errors.csv` (median and mean absolute percentage
error, the shares within 10 % and 25 % and the median signed error, by GPU, backend, model kind,
model, mode and concurrency bucket), `side_by_side.csv` (each model's median errors on the rows every
model predicted), `tables.md` (those tables for docs/validation.md), `ttft.png` and `tpot.png`
(predicted against measured, log axes, the 25 % band drawn) and `report.html` (all of it).
`--report-only` writes the tables and plots again from an existing `predictions.csv`.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from silicon_aic import aic_estimates, ensure_aiconfigurator  # bench/, beside this script
from silicon_rows import MODEL_IDS, Skipped, concurrency, deployment

from cluster.config_load import ConfigError, build_config
from cluster.sweep import run_in_processes
from cluster.virtual import run_virtual
from emulation import trust
from emulation.hf_config import ModelConfigError
from emulation.profiles import GPUS, base_profile
from emulation.silicon_systems import package_dir

TIME_MODELS = ("aggregate", "operators", "measured")
REQUESTS_PER_SLOT = 2
"""Requests a closed loop sends per slot after its first wave (one slot's worth), at least MIN_REQUESTS
in all. Two, not InferenceX's nine: on 55 rows (a random 60) two against three moved the predicted
means by a median of 0 % and a mean of 1.3 % (TTFT) and 0.9 % (TPOT), at most 19 % and 7 %, for 27 %
less work; one moved them up to 50 % (measured with the first wave left out, before it was weighed
as FIRST_WAVE_WEIGHT)."""
FIRST_WAVE_WEIGHT = 0.1
"""The first wave's share of a measured mean. InferenceX warms up in a separate run, then sends
10 x concurrency requests, all measured: the first `concurrency` arrive at once (a burst whose prompts
queue behind each other), the rest as slots free. The replay sends fewer (REQUESTS_PER_SLOT), so its
means weigh the first wave as the benchmark's do, 1 in 10, and the rest 9 in 10."""
MIN_REQUESTS = 32
MAX_REPLAY_TOKENS = 20_000_000
"""The most prompt and output tokens one row's replay may carry: a row above (concurrency up to 16,384
at 9k tokens: 600 M) is skipped with its size as the reason, not run out of memory (one took 12 GB)."""
CHUNK = 64
"""Predictions run and written a chunk at a time: a run stopped or crashed keeps what it finished."""
BY = ("system", "backend", "model_kind", "model_path", "mode", "load")
LOAD_EDGES = (4, 16, 64, 256, 1024)
"""Concurrency buckets of the error tables: c1-4, c5-16, ..., c>1024."""


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
    run = run_virtual(cfg, metrics=False)
    summary = run.summary
    ttft_ms, tpot_ms = benchmark_means(run.results, cfg.workload.max_concurrency)
    return {
        **out,
        "ttft_ms": ttft_ms,
        "tpot_ms": tpot_ms,
        "requests": summary["completed"],
        "failed": summary["failed"] + summary["rejected"],
        "wall_s": round(time.perf_counter() - start, 3),
        **measured_share(summary),
    }


def measured_share(summary: dict[str, Any]) -> dict[str, float]:
    """`measured`: the mean over the row's engine roles of their step time's measured share."""
    shares = summary.get("measured_share_by_role")
    return {"measured_share": float(np.mean(list(shares.values())))} if shares else {}


def benchmark_means(results: pd.DataFrame, max_concurrency: int | None) -> tuple[float, float]:
    """Mean TTFT and TPOT (ms) of the requests that succeeded, as the row's benchmark measured them:
    under a closed loop, the first wave (the first `max_concurrency` sent) weighs FIRST_WAVE_WEIGHT;
    under Poisson arrivals (None), every request alike."""
    ok = results[results["ok"]].sort_values("arrival_s", kind="stable")
    if max_concurrency is None or len(ok) <= max_concurrency:
        means = ok[["ttft_s", "tpot_s"]].mean()
    else:
        first, rest = ok.iloc[:max_concurrency], ok.iloc[max_concurrency:]
        w = FIRST_WAVE_WEIGHT
        means = w * first[["ttft_s", "tpot_s"]].mean() + (1 - w) * rest[["ttft_s", "tpot_s"]].mean()
    return float(means["ttft_s"]) * 1000, float(means["tpot_s"]) * 1000


def _reason(error: str) -> str:
    """A config error as a countable reason: its field and kind, without the row's own numbers."""
    field, _, rest = error.partition(": ")
    kind = rest.split(";")[0]
    return f"{field.split('=')[0]}: {' '.join(w for w in kind.split() if not any(c.isdigit() for c in w))}"


def errors(table: pd.DataFrame) -> pd.DataFrame:
    """Per time model and group (all rows, then each of BY's): rows, and for TTFT and TPOT the median and
    mean absolute percentage errors, the shares within 10 % and 25 %, and the median signed error (the
    bias: below 0, predictions short of the measurement)."""
    rows = []
    for time_model, by_tm in table.groupby("time_model"):
        for key in ("all", *BY):
            groups = [("all", by_tm)] if key == "all" else list(by_tm.groupby(key))
            for value, g in groups:
                rec: dict[str, Any] = {"time_model": time_model, "by": key, "group": value, "rows": len(g)}
                for metric in ("ttft", "tpot"):
                    signed = (g[f"{metric}_ms"] / g[f"silicon_{metric}_ms"] - 1) * 100
                    ape = signed.abs()
                    rec[f"{metric}_mdape"] = ape.median()
                    rec[f"{metric}_mape"] = ape.mean()
                    rec[f"{metric}_within_10"] = (ape <= 10).mean() * 100
                    rec[f"{metric}_within_25"] = (ape <= 25).mean() * 100
                    rec[f"{metric}_bias"] = signed.median()
                rows.append(rec)
    return pd.DataFrame(rows)


def side_by_side(judged: pd.DataFrame) -> pd.DataFrame:
    """On the rows every time model predicted: per group, the rows and each model's TTFT and TPOT median
    absolute percentage error, side by side (one column a model and metric)."""
    models = judged["time_model"].unique()
    counts = judged.groupby("id")["time_model"].nunique()
    common = judged[judged["id"].isin(counts[counts == len(models)].index)]
    errs = errors(common)
    wide = errs.pivot_table(index=["by", "group"], columns="time_model", values=["ttft_mdape", "tpot_mdape"])
    wide.columns = [f"{metric.split('_')[0].upper()} {model}" for metric, model in wide.columns]
    wide = wide.join(errs.groupby(["by", "group"])["rows"].first()).reset_index()
    rank = {key: i for i, key in enumerate(("all", *BY))}
    wide = wide.sort_values(["by", "group"], key=lambda c: c.map(rank) if c.name == "by" else c.map(_order))
    return wide[["by", "group", "rows", *sorted(c for c in wide.columns if " " in c)[::-1]]]


def _order(group: Any) -> Any:
    """A group's sort key: load buckets by their concurrency (c5-16 after c1-4), others as named."""
    text = str(group)
    return (
        f"{int(text[1:].split('-')[0].lstrip('>')):08d}" if text[:1] == "c" and text[1:2].isdigit() else text
    )


def load_bucket(num_in_flight: int | None) -> str:
    """A row's concurrency as a bucket of LOAD_EDGES (`c1-4`, ..., `c>1024`)."""
    if num_in_flight is None:
        return "rate"
    low = 1
    for edge in LOAD_EDGES:
        if num_in_flight <= edge:
            return f"c{low}-{edge}"
        low = edge + 1
    return f"c>{LOAD_EDGES[-1]}"


def model_kind(model_path: str) -> str:
    """What kind of model a row serves (`emulation.trust.model_kind`); `unknown` where its config does
    not ship."""
    try:
        return trust.model_kind(base_profile(MODEL_IDS.get(model_path, model_path)))
    except ModelConfigError:
        return "unknown"


def trust_groups(judged: pd.DataFrame) -> list[dict[str, Any]]:
    """Per time model, GPU family, model kind and mode (`emulation.trust`'s groups): the rows and their
    TTFT and TPOT median absolute and signed percentage errors."""
    table = judged.assign(
        gpu_family=[trust.gpu_family(GPUS[s]) if s in GPUS else s for s in judged["system"]]
    )
    keys = ["time_model", "gpu_family", "model_kind", "mode"]
    groups = []
    for key, g in table.groupby(keys):
        rec: dict[str, Any] = {**dict(zip(keys, key, strict=True)), "num_rows": len(g)}
        for metric in ("ttft", "tpot"):
            signed = (g[f"{metric}_ms"] / g[f"silicon_{metric}_ms"] - 1) * 100
            rec[f"{metric}_mdape"] = round(float(signed.abs().median()), 1)
            rec[f"{metric}_bias"] = round(float(signed.median()), 1)
        groups.append(rec)
    return groups


def _scatter(table: pd.DataFrame, metric: str) -> bytes:
    """Predicted against measured, log axes, the +-25 % band; a PNG."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for time_model, g in table.groupby("time_model"):
        ax.scatter(g[f"silicon_{metric}_ms"], g[f"{metric}_ms"], s=6, alpha=0.4, label=str(time_model))
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
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _markdown(table: pd.DataFrame) -> str:
    """`table` as a Markdown table, numbers to three figures (by hand: pandas' `to_markdown` needs
    tabulate, which the project does not depend on)."""
    cells = table.map(lambda x: f"{x:.3g}" if isinstance(x, float) else str(x))
    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(r) + " |" for r in cells.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def write_report(out: Path, predictions: pd.DataFrame, rows: pd.DataFrame, split: str) -> None:
    """`errors.csv`, `side_by_side.csv`, `tables.md`, `ttft.png`, `tpot.png` and `report.html` of
    `predictions` against `rows`' measurements, over `split`."""
    table = predictions.reindex(columns=[*predictions.columns.drop("skipped", errors="ignore"), "skipped"])
    table = table.merge(rows, on="id")
    done = table[table["skipped"].isna()]
    judged = done if split == "all" else done[done["split"] == split]
    errs = errors(judged) if len(judged) else pd.DataFrame()
    errs.to_csv(out / "errors.csv", index=False)
    if split == "held-out":  # what runs say of their trust (emulation.trust), from the held-out rows only
        source = {"split": split, "written": time.strftime("%Y-%m-%d"), "groups": trust_groups(judged)}
        (out / "silicon_errors.json").write_text(json.dumps(source, indent=1) + "\n")
    both = side_by_side(judged) if len(judged) else pd.DataFrame()
    both.to_csv(out / "side_by_side.csv", index=False)
    skipped = table.groupby(["time_model", "skipped"]).size().sort_values(ascending=False)
    ours = done[done["time_model"] != "aiconfigurator"]
    n_rows, n_expressed, n_judged = rows["id"].nunique(), ours["id"].nunique(), judged["id"].nunique()
    coverage = (
        f"{n_expressed} of {n_rows} rows expressed ({n_expressed / max(n_rows, 1):.0%}); errors over the "
        f"{split} split ({n_judged} rows predicted by at least one model)."
    )
    overall = errs[errs["by"] == "all"].drop(columns=["by", "group"]) if len(errs) else errs
    md = [
        coverage,
        "\n\n## Each model on the rows it predicted\n\n",
        _markdown(overall) if len(overall) else "none\n",
        "\n## Side by side, on the rows every model predicted (median absolute % error)\n\n",
        _markdown(both) if len(both) else "none\n",
        "\n## Skipped, by reason\n\n",
        _markdown(skipped.rename("rows").reset_index()) if len(skipped) else "none\n",
    ]
    (out / "tables.md").write_text("".join(md))
    parts = [
        f"<h1>Silicon validation</h1><p>{coverage} Nothing fitted.</p>",
        "<h2>Each model on the rows it predicted</h2>"
        + errs.to_html(index=False, float_format=lambda x: f"{x:.3g}"),
        "<h2>Side by side, on the rows every model predicted</h2>"
        + both.to_html(index=False, float_format=lambda x: f"{x:.3g}"),
        "<h2>Skipped, by reason</h2>" + skipped.to_frame("rows").to_html(),
    ]
    for metric in ("ttft", "tpot") if len(judged) else ():
        png = _scatter(judged, metric)
        (out / f"{metric}.png").write_bytes(png)
        b64 = base64.b64encode(png).decode()
        parts.append(f'<h2>{metric.upper()}</h2><img src="data:image/png;base64,{b64}">')
    head = "<head><meta charset='utf-8'><title>silicon validation</title></head>"
    (out / "report.html").write_text(f"<html>{head}<body>{''.join(parts)}</body></html>")
    reasons = "; ".join(f"{model}: {reason} ({n})" for (model, reason), n in skipped.items())
    print(f"{coverage} Skipped: {reasons or 'none'}")
    if len(overall):
        print(overall.to_string(index=False))


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
    p.add_argument(
        "--report-only",
        action="store_true",
        help="predict nothing: write the tables and the report again from --out's predictions.csv",
    )
    args = p.parse_args()
    source = args.rows or (package_dir() / "systems" / "silicon_sample.csv" if package_dir() else None)
    if source is None:
        print("error: --rows: aiconfigurator-core is not installed, so give a CSV", file=sys.stderr)
        return 2
    rows = pd.read_csv(source)
    rows["split"] = rows["id"].map(split_of)
    rows["load"] = [load_bucket(concurrency(r)) for r in rows.to_dict("records")]
    rows["model_kind"] = rows["model_path"].map({m: model_kind(m) for m in rows["model_path"].unique()})
    chosen = rows if args.split == "all" else rows[rows["split"] == args.split]
    if args.limit:
        chosen = chosen.head(args.limit)
    keep = ["id", "split", *BY, "silicon_ttft_ms", "silicon_tpot_ms"]
    if args.report_only:
        write_report(args.out, pd.read_csv(args.out / "predictions.csv"), chosen[keep], args.split)
        return 0
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
    write_report(args.out, predictions, chosen[keep], args.split)
    return 0


if __name__ == "__main__":
    sys.exit(main())
