"""The silicon validation bench end to end on a reduced set: 40 held-out rows of aiconfigurator-core's
silicon_sample.csv, half aggregated and half disaggregated, across backends and models (the cheapest
of each kind to replay), on each time model. It proves the harness works (every row predicted or
skipped with a reason, the tables and the report written); it judges no error (bench/, docs/validation.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from emulation.silicon_systems import package_dir

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
pytestmark = [
    pytest.mark.full,
    pytest.mark.parallel,  # a bench in a process of its own, writing to a temporary directory
    pytest.mark.skipif(package_dir() is None, reason="aiconfigurator-core is not installed"),
]


def _reduced_rows(path: Path) -> pd.DataFrame:
    """20 aggregated and 20 disaggregated held-out rows the bench expresses: the cheapest of each
    (backend, model), then the next cheapest of each, and so on."""
    sys.path.insert(0, str(BENCH))
    from silicon_rows import Skipped, concurrency, deployment
    from silicon_validation import num_requests, split_of

    assert package_dir() is not None
    rows = pd.read_csv(package_dir() / "systems" / "silicon_sample.csv")
    rows["c"] = [concurrency(r) for r in rows.to_dict("records")]
    records = rows.to_dict("records")
    expressed = pd.Series([not isinstance(deployment(r, num_requests(r)), Skipped) for r in records])
    rows = rows[(rows["id"].map(split_of) == "held-out") & rows["c"].notna() & expressed]
    rows = rows.assign(cost=rows["c"] * (rows["isl"] + rows["osl"])).sort_values(["cost", "id"])
    rows["turn"] = rows.groupby(["mode", "backend", "model_path"]).cumcount()  # each kind in turn
    picked = [rows[rows["mode"] == mode].sort_values(["turn", "cost"]).head(20) for mode in ("agg", "disagg")]
    chosen = pd.concat(picked).drop(columns=["c", "cost", "turn"])
    chosen.to_csv(path, index=False)
    return chosen


def test_the_bench_predicts_or_explains_every_row_and_writes_its_tables(tmp_path):
    chosen = _reduced_rows(tmp_path / "rows.csv")
    assert len(chosen) == 40 and set(chosen["mode"]) == {"agg", "disagg"}
    argv = [sys.executable, str(BENCH / "silicon_validation.py"), "--rows", str(tmp_path / "rows.csv"),
            "--jobs", "2", "--out", str(tmp_path / "out")]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    predictions = pd.read_csv(tmp_path / "out" / "predictions.csv")
    assert len(predictions) == 120
    assert set(predictions["time_model"]) == {"aggregate", "operators", "measured"}
    predicted = predictions["skipped"].isna()
    assert predicted.sum() >= 90, predictions["skipped"].value_counts()
    shares = predictions.loc[predicted & (predictions["time_model"] == "measured"), "measured_share"]
    assert shares.between(0, 1 + 1e-9).all() and shares.median() > 0.5  # most step time from the tables
    assert (predictions.loc[predicted, ["ttft_ms", "tpot_ms"]] > 0).all().all()
    assert (predictions.loc[predicted, "failed"] == 0).all()
    errors = pd.read_csv(tmp_path / "out" / "errors.csv")
    assert {"all", "system", "backend", "model_kind", "model_path", "mode", "load"} <= set(errors["by"])
    columns = set(pd.read_csv(tmp_path / "out" / "side_by_side.csv").columns)
    assert {"TTFT aggregate", "TTFT operators", "TTFT measured", "TPOT measured"} <= columns
    groups = json.loads((tmp_path / "out" / "silicon_errors.json").read_text())["groups"]
    assert {g["time_model"] for g in groups} == {"aggregate", "operators", "measured"}
    assert sum(g["num_rows"] for g in groups if g["time_model"] == "measured") == shares.size
    html = (tmp_path / "out" / "report.html").read_text()
    assert "rows expressed" in html and html.count("<img") == 2
    tables = (tmp_path / "out" / "tables.md").read_text()
    assert "rows expressed" in tables and "| operators |" in tables

    # The tables again from the predictions alone, as they were.
    (tmp_path / "out" / "tables.md").unlink()
    again = subprocess.run([*argv, "--report-only"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (tmp_path / "out" / "tables.md").read_text() == tables
