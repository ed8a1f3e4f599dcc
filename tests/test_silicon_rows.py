"""The silicon bench's reading of a row (bench/silicon_rows.py) and its benchmark means
(bench/silicon_validation.py): the concurrency the benchmark ran, the lengths its client drew, the
rows whose layout their export lost, the first wave's weight."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from silicon_rows import Skipped, concurrency, deployment
from silicon_validation import benchmark_means

from emulation.silicon_systems import package_dir
from workloads.synthetic import length_bounds

needs_configs = pytest.mark.skipif(package_dir() is None, reason="aiconfigurator-core is absent")


def _row(**fields: Any) -> dict[str, Any]:
    """An aggregated InferenceX row of Llama-3.1-70B on H100 at TP 4, 32 in flight, with `fields`."""
    row = {
        "id": "row", "silicon_data_source": "source_file=2026-04-06.csv; silicon_concurrency=32",
        "backend": "vllm", "model_path": "meta-llama/Llama-3.1-70B", "system": "h100_sxm", "mode": "agg",
        "isl": 1024, "osl": 1024, "gemm_quant_mode": "fp8", "moe_quant_mode": None, "batch_size": 32,
        "tp_size": 4, "pp_size": 1, "attention_dp_size": 1, "moe_tp_size": None, "moe_ep_size": None,
    }  # fmt: skip
    return row | fields


def test_the_concurrency_is_the_benchmarks_not_the_batch_of_one_attention_dp_rank():
    # A DEP8 row: batch_size is concurrency / attention DP ranks.
    row = _row(batch_size=8, attention_dp_size=8, silicon_data_source="db-dump/x; silicon_concurrency=64")
    assert concurrency(row) == 64
    assert concurrency(_row(silicon_data_source="/private/run.csv", batch_size=16)) == 16
    assert concurrency(_row(silicon_data_source="", batch_size=float("nan"))) is None


@needs_configs
def test_an_inferencex_row_draws_its_lengths_as_that_client_does():
    raw = deployment(_row(), 96)
    assert not isinstance(raw, Skipped)
    w = raw["workload"]
    # The client's --random-range-ratio 0.8 draws uniformly in [0.8 L, L]; here within a token of it.
    low, high = length_bounds(w["prompt_len"], w["random_range_ratio"])
    assert abs(low - 0.8 * 1024) <= 1 and abs(high - 1024) <= 1
    assert raw["scheduler"]["max_model_len"] >= 2 * high
    assert w["max_concurrency"] == 32 and "num_warmup_requests" not in w

    private = deployment(_row(silicon_data_source="/private/run.csv"), 96)
    assert not isinstance(private, Skipped)
    assert private["workload"]["prompt_len"] == 1024 and "random_range_ratio" not in private["workload"]


@needs_configs
@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (
            {"mode": "disagg", "prefill_tp_size": 8, "decode_tp_size": 32},
            "disaggregated row without worker counts",
        ),
        (
            {"model_path": "deepseek-ai/DeepSeek-R1", "tp_size": 64, "moe_tp_size": 8, "moe_ep_size": 8},
            "an aggregated worker larger than a node",
        ),
    ],
)
def test_a_row_whose_export_lost_its_layout_is_skipped_with_the_reason(fields, reason):
    skipped = deployment(_row(**fields), 96)
    assert isinstance(skipped, Skipped) and skipped.reason.startswith(reason)


def test_the_first_wave_weighs_as_one_request_in_ten():
    results = pd.DataFrame(
        {
            "arrival_s": [0.0, 0.0, 1.0, 1.5, 2.0],
            "ok": [True, True, True, True, False],
            "ttft_s": [1.0, 1.0, 0.1, 0.1, 9.0],
            "tpot_s": [0.02, 0.02, 0.01, 0.01, 9.0],
        }
    )
    ttft_ms, tpot_ms = benchmark_means(results, max_concurrency=2)
    assert ttft_ms == pytest.approx(0.1 * 1000 + 0.9 * 100)
    assert tpot_ms == pytest.approx(0.1 * 20 + 0.9 * 10)
    assert benchmark_means(results, max_concurrency=None)[0] == pytest.approx(1000 * 2.2 / 4)
