"""Kernel lookups (emulation/kernel_tables.py) against the rows aiconfigurator-core measured on an H100
for vLLM 0.24.0: at a measured shape the lookup is the measurement, between two measured shapes it is
between them, and a format or GPU without tables is told apart from a measured answer."""

from __future__ import annotations

import pandas as pd
import pytest

from emulation.kernel_tables import KernelTables, KernelTablesError
from emulation.silicon_systems import package_dir

pytestmark = pytest.mark.skipif(package_dir() is None, reason="aiconfigurator-core is not installed")


@pytest.fixture(scope="module")
def h100() -> KernelTables:
    return KernelTables("h100_sxm")


def _table(family: str, name: str) -> pd.DataFrame:
    root = package_dir()
    assert root is not None
    folder = root / "systems" / "data" / "h100_sxm" / family / "vllm" / "0.24.0"
    return pd.read_parquet(folder / f"{name}.parquet")


def _neighbours(rows: pd.DataFrame, axis: str) -> tuple[pd.Series, pd.Series]:
    """Two rows measured next to each other along `axis`, at least 4 apart (a point strictly between)."""
    rows = rows.sort_values(axis).reset_index(drop=True)
    gap = rows[axis].diff()
    i = int(gap[gap >= 4].index[len(gap[gap >= 4]) // 2])
    return rows.iloc[i - 1], rows.iloc[i]


def _between(value: float, a: float, b: float) -> bool:
    return min(a, b) <= value <= max(a, b)


def test_a_gemm_is_its_measurement_at_a_measured_shape_and_between_neighbours(h100):
    gemms = _table("gemm", "gemm_perf")
    n, k = 6144, 4096
    rows = gemms[(gemms["gemm_dtype"] == "bfloat16") & (gemms["n"] == n) & (gemms["k"] == k)]
    low, high = _neighbours(rows, "m")
    for row in (low, high):
        assert h100.gemm(int(row["m"]), n, k, "bf16").s == pytest.approx(row["latency"] / 1000, rel=1e-6)
    mid = h100.gemm(int((low["m"] + high["m"]) // 2), n, k, "bf16")
    assert mid.measured and _between(mid.s * 1000, low["latency"], high["latency"])


def test_an_all_reduce_is_its_measurement_in_elements_not_bytes(h100):
    rows = _table("comm", "custom_allreduce_perf")
    hidden, tp = 4096, 4
    graphs = rows[(rows["backend"] == "vllm_graph") & (rows["num_gpus"] == tp)]
    for tokens in (1, 64):  # message_size counts elements: tokens x hidden
        measured = graphs[graphs["message_size"] == tokens * hidden]["latency"].item()
        assert h100.all_reduce(tokens, hidden, tp).s == pytest.approx(measured / 1000, rel=1e-6)


def test_an_moe_layer_is_its_measurement_and_monotone_between_token_counts(h100):
    moes = _table("moe", "moe_perf")
    shape = {"hidden_size": 2048, "inter_size": 768, "topk": 8, "num_experts": 128, "moe_tp_size": 1,
             "moe_ep_size": 1, "moe_dtype": "bfloat16", "distribution": "balanced"}  # fmt: skip
    rows = moes.loc[(moes[list(shape)] == pd.Series(shape)).all(axis=1)]
    low, high = _neighbours(rows, "num_tokens")

    def lookup(tokens: float) -> float:
        answer = h100.moe(int(tokens), 2048, 768, 8, 128, 1, 1, "bf16")
        assert answer is not None and answer.measured
        return answer.s * 1000

    assert lookup(low["num_tokens"]) == pytest.approx(low["latency"], rel=1e-6)
    assert _between(lookup((low["num_tokens"] + high["num_tokens"]) // 2), low["latency"], high["latency"])


def test_attention_is_its_measurement_within_the_packages_own_additions(h100):
    """Prefill attention adds the package's analytic RoPE and KV-write time (µs) to the measured
    kernel; decode attention averages five KV lengths within ±10 % of the one asked."""
    heads = {
        "num_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "kv_cache_dtype": "bfloat16",
        "window_size": 0,
    }
    context = _table("attention", "context_attention_perf")
    rows = context.loc[(context[list(heads)] == pd.Series(heads)).all(axis=1) & (context["batch_size"] == 1)]
    low, high = _neighbours(rows, "isl")
    for row in (low, high):
        answer = h100.context_attention(1, int(row["isl"]), 0, 32, 8, 128, 2)
        assert answer.measured and 0 <= answer.s * 1000 - row["latency"] < 0.02
    mid = h100.context_attention(1, int((low["isl"] + high["isl"]) // 2), 0, 32, 8, 128, 2).s
    assert h100.context_attention(1, int(low["isl"]), 0, 32, 8, 128, 2).s < mid
    assert mid < h100.context_attention(1, int(high["isl"]), 0, 32, 8, 128, 2).s
    # A chunk after a cached prefix costs more than the same chunk alone, less than the whole.
    alone, after, whole = (h100.context_attention(1, s, p, 32, 8, 128, 2).s for s, p in
                           ((1024, 0), (1024, 3072), (4096, 0)))  # fmt: skip
    assert alone < after < whole

    generation = _table("attention", "generation_attention_perf")
    rows = generation.loc[
        (generation[list(heads)] == pd.Series(heads)).all(axis=1) & (generation["batch_size"] == 64)
    ]
    row = rows[rows["step"] == 4095].iloc[0]  # step: the KV length - 1
    answer = h100.generation_attention(64, 4096, 32, 8, 128, 2)
    assert answer.measured and answer.s * 1000 == pytest.approx(row["latency"], rel=0.05)


def test_what_has_no_table_is_none_and_a_gpu_without_tables_is_refused_in_one_line(h100):
    assert h100.gemm(128, 6144, 4096, "mxfp4") is None  # no MXFP4 linear kernels
    assert h100.gemm(128, 6144, 4096, "nvfp4") is None  # no FP4 tensor cores on Hopper
    assert h100.gemm(128, 6144, 4096, "int4_wo") is None  # not collected for vLLM 0.24.0 on H100
    with pytest.raises(KernelTablesError, match=r"^no vllm current kernel tables for l4: ") as refused:
        KernelTables("l4")
    assert "\n" not in str(refused.value)
