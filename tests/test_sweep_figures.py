"""A sweep of a MoE, hybrid or offload target carries, per design and rate, what a run of the same design
at that rate carries: the summary's figures (a MoE target's expert load per engine role, the KV and SSM
state each handoff moved, where prompt tokens came from by offload tier), engines.json, and the report's
section and plot. Small sweeps: one job, few requests, compute skip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from cluster.cli import main
from cluster.sweep import point_engine
from dashboards.offload_plots import SOURCES, hits_by_tier
from emulation.profiles import MODELS
from workloads.summary import PROMPT_SOURCES, mean_records, moe_means


def _testbed(out: Path, command: str, *args: str) -> list[dict[str, Any]]:
    """`testbed COMMAND ARGS --compute skip --out OUT`'s summary records."""
    assert main([command, *args, "--compute", "skip", "--out", str(out)]) == 0
    records: list[dict[str, Any]] = json.loads((out / "summary.json").read_text())
    return records


def _point(records: list[dict[str, Any]], design: str, rate: float | None = None) -> dict[str, Any]:
    """The record of `design` at `rate` (None: its only one)."""
    (record,) = [r for r in records if r["design"] == design and rate in (None, r["rate"])]
    return record


def _assert_in_report(out: Path, caption: str, plot: str) -> None:
    page = (out / "report.html").read_text()
    assert f"<h2>{caption}" in page
    assert f'alt="{plot}" src="data:image/png;base64,' in page
    assert (out / "plots" / f"{plot}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


MOE_DESIGN = "pd-ep32-ep72"
MOE = ["--preset", "deepseek-v3-h800", "--design", MOE_DESIGN, "--num-requests", "20"]


def test_a_moe_sweep_carries_each_points_expert_load(tmp_path):
    records = _testbed(tmp_path / "sweep", "sweep", *MOE, "--rates", "1,2", "--jobs", "1")
    engines = json.loads((tmp_path / "sweep" / "engines.json").read_text())[MOE_DESIGN]
    assert {r["rate"] for r in records} == {1.0, 2.0}
    for r in records:
        by_role = r["moe_steps_by_role"]
        assert set(by_role) == {"prefill", "decode"}
        for role, means in by_role.items():
            log = engines[point_engine(f"{role}-0", r["rate"], 0)]["moe_steps"]
            assert means == pytest.approx(moe_means(log))  # the summary's figures are the step log's
            assert means["num_steps"] > 0 and means["imbalance"] >= 1.0
            assert means["max_tokens_per_expert"] >= means["mean_tokens_per_expert"] > 0
        assert by_role["decode"]["all_to_all_s"] > 0  # data-parallel attention: all-to-alls
    _assert_in_report(tmp_path / "sweep", "MoE steps per engine", "moe_steps")
    page = (tmp_path / "sweep" / "report.html").read_text()
    assert all(point_engine("decode-0", rate, 0) in page for rate in (1, 2))  # the table, per rate
    run = _testbed(tmp_path / "run", "run", *MOE, "--rate", "2")
    for role, means in _point(run, MOE_DESIGN)["moe_steps_by_role"].items():
        assert means == pytest.approx(_point(records, MOE_DESIGN, 2.0)["moe_steps_by_role"][role])


HYBRID = ["--preset", "qwen3-next-h200", "--design", "pd-tp4-tp4,tp8", "--num-requests", "20"]
HANDOFF_KEYS = (
    "num_handoffs",
    "mean_kv_bytes_per_handoff",
    "mean_state_bytes_per_handoff",
    "state_share_of_handoff_bytes",
)


def test_a_hybrid_sweep_carries_each_points_state_bytes_per_handoff(tmp_path):
    records = _testbed(tmp_path / "sweep", "sweep", *HYBRID, "--rates", "1,2", "--jobs", "1")
    results = pd.read_parquet(tmp_path / "sweep" / "results.parquet")
    state_bytes = MODELS["qwen3-next-80b-a3b"].state_bytes_per_gpu(4) * 4  # every decode rank's slice
    for rate in (1.0, 2.0):
        pd_point = _point(records, "pd-tp4-tp4", rate)
        rows = results[(results["design"] == "pd-tp4-tp4") & (results["rate"] == rate) & results["ok"]]
        assert pd_point["num_handoffs"] == pd_point["completed"] == 20
        assert pd_point["mean_state_bytes_per_handoff"] == state_bytes == 39_518_208
        assert pd_point["mean_kv_bytes_per_handoff"] == pytest.approx(rows["kv_bytes"].mean())
        kv = pd_point["mean_kv_bytes_per_handoff"]
        assert pd_point["state_share_of_handoff_bytes"] == pytest.approx(state_bytes / (kv + state_bytes))
        collocated = _point(records, "tp8", rate)
        assert collocated["num_handoffs"] == 0 and collocated["mean_state_bytes_per_handoff"] is None
    _assert_in_report(tmp_path / "sweep", "Hybrid target: handoffs", "hybrid_handoff")
    run = _testbed(tmp_path / "run", "run", *HYBRID, "--rate", "2")
    for design in ("pd-tp4-tp4", "tp8"):
        mine, swept = _point(run, design), _point(records, design, 2.0)
        assert [mine[k] for k in HANDOFF_KEYS] == pytest.approx([swept[k] for k in HANDOFF_KEYS])


OFFLOAD = [
    "--preset", "offload-h200", "--design", "collocated,collocated-host",
    # one engine of 600 GPU blocks: four 4,000-token chats evict each other's first turn before their
    # second comes 5 s later (a host tier keeps it); a synthetic workload repeats no prompt
    "--set", "workload.kind=multi_turn", "--set", "pools.mixed.replicas=1",
    "--set", "scheduler.num_gpu_blocks_override=600", "--set", "scheduler.max_model_len=6000",
    "--set", "workload.prompt_len=4400", "--set", "workload.output_len=20",
    "--set", "multi_turn.num_conversations=4", "--set", "multi_turn.num_turns=constant:2",
    "--set", "multi_turn.conversation_rate=10", "--set", "multi_turn.common_prefix_tokens=0",
    "--set", "multi_turn.prefix_tokens=constant:3600", "--set", "multi_turn.user_tokens=constant:400",
    "--set", "multi_turn.output_tokens=constant:20", "--set", "multi_turn.think_s=constant:5",
]  # fmt: skip
"""offload-h200 replays a trace, which a sweep has no flag for: its designs on generated chats instead.
(A session workload paces itself: every rate of a sweep replays the same sessions, so one rate.)"""
SHARES = "prompt_token_share_by_source"


def test_an_offload_sweep_carries_each_points_prompt_tokens_by_tier(tmp_path):
    records = _testbed(tmp_path / "sweep", "sweep", *OFFLOAD, "--rates", "1", "--jobs", "1")
    results = pd.read_parquet(tmp_path / "sweep" / "results.parquet")
    host = _point(records, "collocated-host")
    ok = results[(results["design"] == "collocated-host") & results["ok"]]
    assert host[SHARES]["host"] > 0.3
    assert host[SHARES]["host"] == pytest.approx(
        ok["prompt_host_tokens"].sum() / ok["num_prompt_tokens"].sum()
    )
    assert sum(host[SHARES].values()) == pytest.approx(1.0)
    assert _point(records, "collocated")[SHARES]["host"] == 0.0
    _assert_in_report(tmp_path / "sweep", "KV offloading: where prompt tokens came from", "prompt_sources")
    figure = hits_by_tier(records)  # the plot's bars are the records' shares
    assert figure is not None
    bars = [b for b in figure.axes[0].patches if b.get_gid() == "collocated-host"]
    assert [b.get_width() for b in bars] == pytest.approx([host[SHARES][s] for s in PROMPT_SOURCES])
    assert len(bars) == len(SOURCES)
    run = _testbed(tmp_path / "run", "run", *OFFLOAD)
    for design in ("collocated", "collocated-host"):
        assert _point(run, design)[SHARES] == pytest.approx(_point(records, design)[SHARES])


def test_seeds_average_nested_figures_key_by_key():
    one = {"design": "d", "moe_steps_by_role": {"decode": {"imbalance": 1.0}}, "ttft": None}
    two = {
        "design": "d",
        "moe_steps_by_role": {"decode": {"imbalance": 3.0}, "prefill": {"imbalance": 2.0}},
        "ttft": 4,
    }
    assert mean_records([one, two]) == {
        "design": "d",
        "moe_steps_by_role": {"decode": {"imbalance": 2.0}, "prefill": {"imbalance": 2.0}},
        "ttft": 4.0,
    }
