"""AIConfigurator's own estimates of the silicon rows, to set beside the testbed's
(bench/silicon_validation.py). Never a dependency of the project: `aiconfigurator==0.12.0` lives in a
venv of its own, installed on first use (`python3 -m venv`, then pip), as bench/dynamo_replay.py does
for Dynamo.

    .venv/bin/python bench/silicon_aic.py --out FILE.csv [--rows CSV] [--limit N] [--jobs 2] \\
        [--venv DIR] [--no-install]

Each row (the columns of aiconfigurator-core's `systems/silicon_sample.csv`) goes to
bench/silicon_aic_worker.py, run in that venv: `aiconfigurator.cli.api.cli_estimate` called as
AIConfigurator's own accuracy regression calls it on that CSV (its repository's
tools/accuracy_regression_testing/predict_silicon_sample.py), the worker's docstring says how and
where it departs. Rows go in batches, grouped by system, backend and model so that each process loads
a database once, up to `--jobs` processes at a time. Writes one line a row: id, aic_ttft_ms,
aic_tpot_ms, aic_skipped (why there is no estimate), aic_backend_version (the database version asked
for), aic_note (what differs from the row), aic_wall_s (the row's estimate, a cache hit ~0); prints
the rows estimated, the skips by reason, wall time per row and, where the rows carry silicon_ttft_ms
and silicon_tpot_ms, the median absolute percentage error of each. All 5,221 rows take about two
minutes on two cores (~1-8 s a process for each new database or model, ~0.02 s an estimate after).

Library use: `py, why = ensure_aiconfigurator(venv, install)`, then `aic_estimates(rows, py, jobs)`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd

AIC_VERSION = "0.12.0"
CACHE = Path(os.environ.get("TESTBED_CACHE") or Path.home() / ".cache" / "disagg-testbed")
AIC_VENV = CACHE / f"aiconfigurator-{AIC_VERSION}"
WORKER = Path(__file__).resolve().with_name("silicon_aic_worker.py")
COLUMNS = ("id", "aic_ttft_ms", "aic_tpot_ms", "aic_skipped", "aic_backend_version", "aic_note", "aic_wall_s")
BATCH = 250
"""Rows a worker process takes at most (its import and database loads, ~seconds, paid once)."""
BATCH_TIMEOUT_S, ROW_TIMEOUT_S = 300.0, 30.0
"""A batch is given BATCH_TIMEOUT_S + ROW_TIMEOUT_S a row before it is stopped."""


def ensure_aiconfigurator(venv: Path = AIC_VENV, install: bool = True) -> tuple[Path | None, str]:
    """The venv's interpreter once `aiconfigurator.cli.api` imports there at AIC_VERSION (installing it
    if allowed), or None and why not, in one line."""
    py = venv / "bin" / "python"
    probe = [
        str(py),
        "-c",
        "import aiconfigurator.cli.api, importlib.metadata as m; print(m.version('aiconfigurator'))",
    ]

    def ready() -> bool:
        if not py.exists():
            return False
        r = subprocess.run(probe, capture_output=True, text=True, timeout=300)
        return r.returncode == 0 and r.stdout.strip().splitlines()[-1:] == [AIC_VERSION]

    if ready():
        return py, ""
    if not install:
        return None, f"aiconfigurator {AIC_VERSION} is not installed in {venv} (--no-install)"
    steps = [
        [shutil.which("python3") or sys.executable, "-m", "venv", str(venv)],
        [str(py), "-m", "pip", "install", "-q", f"aiconfigurator=={AIC_VERSION}"],
    ]
    for cmd in steps:
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"`{' '.join(cmd[:4])} ...` failed: {e}"
        if r.returncode:
            last = (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.returncode}"]
            return None, f"`{' '.join(cmd[:4])} ...` failed: {last[0]}"
    if ready():
        return py, ""
    return None, f"aiconfigurator.cli.api does not import in {venv} after installing"


def _plain(value: Any) -> Any:
    """A cell as JSON carries it: NaN and pandas' missing values as null, numpy scalars as Python's."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return None
    return value.item() if hasattr(value, "item") else value


def _run_batch(py: Path, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One worker process over `batch`: a record per row, the rows it did not answer marked why."""
    payload = json.dumps([{k: _plain(v) for k, v in row.items()} for row in batch])
    why = ""
    try:
        r = subprocess.run([str(py), str(WORKER)], input=payload, capture_output=True, text=True,
                           timeout=BATCH_TIMEOUT_S + ROW_TIMEOUT_S * len(batch))  # fmt: skip
        stdout, stderr, rc = r.stdout, r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        stderr, rc, why = "", None, f"worker timed out after {e.timeout:.0f} s"
    got = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            got[rec["id"]] = rec
    if not why and rc:
        tail = stderr.strip().splitlines()[-1:] or [f"exit {rc}"]
        why = f"worker failed: {tail[0][:120]}"
    return [got.get(row["id"]) or {"id": row["id"], "aic_skipped": why or "no answer"} for row in batch]


def aic_estimates(rows: list[dict[str, Any]], py: Path, jobs: int = 1, batch: int = BATCH) -> pd.DataFrame:
    """AIConfigurator's estimates of `rows` (silicon_sample.csv's columns as dicts), one record a row in
    their order: COLUMNS, aic_skipped null where there is an estimate."""
    order = sorted(range(len(rows)), key=lambda i: tuple(str(rows[i].get(k)) for k in
                   ("system", "backend", "backend_version", "model_path", "mode")))  # fmt: skip
    per = max(1, min(batch, math.ceil(len(rows) / max(jobs, 1))))
    batches = [[rows[i] for i in order[s : s + per]] for s in range(0, len(order), per)]
    with ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
        records = [rec for done in pool.map(lambda b: _run_batch(py, b), batches) for rec in done]
    by_id = {rec["id"]: rec for rec in records}
    table = pd.DataFrame([by_id[row["id"]] for row in rows], columns=list(COLUMNS))
    return table.astype({"aic_ttft_ms": float, "aic_tpot_ms": float, "aic_wall_s": float})


NOTES = (
    ("at a slot nearest the row's version", ": nearest "),
    ("at the default version (the row's unset or not a number)", ": default "),
    ("with a shipped model config of the same architecture", "model config of "),
    ("over AIConfigurator's own KV cache estimate (it warns)", "KV cache"),
)
"""How the summary counts aic_note's parts: (what it says, the text that marks it)."""


def summary(rows: pd.DataFrame, est: pd.DataFrame) -> list[str]:
    """Rows estimated, skips by reason (numbers masked), what was substituted and, where measured, the
    median absolute percentage errors."""
    done = est[est["aic_skipped"].isna()]
    lines = [f"{len(done)} of {len(est)} rows estimated by aiconfigurator {AIC_VERSION}"]
    reasons = est["aic_skipped"].dropna().str.replace(r"\b\d+\b", "#", regex=True)
    lines += [f"  skipped ({n}): {reason}" for reason, n in reasons.value_counts().items()]
    notes = est.loc[est["aic_backend_version"].notna(), "aic_note"].fillna("")
    for what, pattern in NOTES:
        lines.append(f"  {notes.str.contains(pattern, regex=False).sum()} rows asked {what}")
    if {"silicon_ttft_ms", "silicon_tpot_ms"} <= set(rows.columns) and len(done):
        table = done.merge(rows[["id", "silicon_ttft_ms", "silicon_tpot_ms"]], on="id")
        for metric in ("ttft", "tpot"):
            ape = (table[f"aic_{metric}_ms"] / table[f"silicon_{metric}_ms"] - 1).abs() * 100
            lines.append(f"  {metric.upper()}: median APE {ape.median():.1f} %, mean {ape.mean():.1f} %, "
                         f"within 25 % {(ape <= 25).mean():.0%} ({ape.notna().sum()} rows)")  # fmt: skip
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=Path, help="a CSV of silicon_sample.csv's columns (default: the package's)")
    p.add_argument("--limit", type=int, help="the first N rows only")
    p.add_argument("--jobs", type=int, default=2, help="worker processes at a time")
    p.add_argument("--venv", type=Path, default=AIC_VENV, help=f"aiconfigurator's venv (default {AIC_VENV})")
    p.add_argument("--no-install", action="store_true", help="fail rather than create the venv")
    p.add_argument("--out", type=Path, required=True, help="the estimates, a CSV")
    args = p.parse_args()
    source = args.rows
    if source is None:
        from emulation.silicon_systems import package_dir

        source = package_dir() / "systems" / "silicon_sample.csv" if package_dir() else None
    if source is None:
        print("error: --rows: aiconfigurator-core is not installed, so give a CSV", file=sys.stderr)
        return 2
    rows = pd.read_csv(source)
    if args.limit:
        rows = rows.head(args.limit)
    py, why = ensure_aiconfigurator(args.venv, not args.no_install)
    if py is None:
        print(f"aiconfigurator {AIC_VERSION} unavailable: {why}")
        return 1
    start = time.perf_counter()
    est = aic_estimates(rows.to_dict("records"), py, args.jobs)
    wall = time.perf_counter() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    est.to_csv(args.out, index=False)
    print("\n".join(summary(rows, est)))
    print(f"{len(rows)} rows in {wall:.1f} s wall ({wall / max(len(rows), 1):.3f} s a row, {args.jobs} "
          f"jobs; estimates alone {est['aic_wall_s'].sum():.1f} s); wrote {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
