"""The run's summary (`workloads.run_summary`): every key a run writes is declared, with its record."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.config_load import load_designs
from cluster.virtual import run_virtual
from messages.latency import HANDOFF_PARTS
from workloads.run_summary import HandoffFigures, RunSummary

MOONCAKE = (
    Path(__file__).resolve().parents[2]
    / "shared/traces/mooncake_fast25/conversation_trace.window_0s_1200s.jsonl"
)
SMALL = ["runner.compute=skip", "workload.num_requests=8"]
RUNS = {  # id: (preset, design, overrides): each kind of figure a summary may carry
    "collocated": ("guide-l40s", "collocated", []),
    "pd": ("guide-l40s", "pd-testbox", []),
    "e-pd": ("epd-a100", "e-pd", ["workload.output_len=8"]),
    "measured-moe": ("qwen3-30b-a3b-h100", "tp8-ep8", ["target.time_model=measured"]),
    "trace": ("agentic-h200", "collocated", [f"replay.trace={MOONCAKE}", "replay.window_s=[0,10]"]),
    "closed-loop": (
        "guide-l40s",
        "collocated",
        ["workload.max_concurrency=2", "workload.num_warmup_requests=2"],
    ),
}


def test_handoff_figures_name_each_part_in_order() -> None:
    parts = [f"{q}_handoff_{part}_ms" for part in HANDOFF_PARTS for q in ("median", "p99")]
    assert list(HandoffFigures.__annotations__) == ["median_handoff_ms", "p99_handoff_ms", *parts]


@pytest.mark.parametrize("run", list(RUNS))
def test_a_summary_has_every_required_key_and_none_undeclared(run: str) -> None:
    preset, design, overrides = RUNS[run]
    (cfg,) = load_designs(preset, [design], [*SMALL, *overrides])
    summary = run_virtual(cfg).summary
    required, optional = RunSummary.__required_keys__, RunSummary.__optional_keys__
    assert not set(summary) - required - optional, f"undeclared: {sorted(set(summary) - required - optional)}"
    assert not required - set(summary), f"missing: {sorted(required - set(summary))}"
    expected = {  # the optional records each run carries
        "e-pd": {"encoder_busy_fraction"},
        "measured-moe": {"measured_coverage"},
        "trace": {"trace", "theoretical_prefix_hit_rate"},
        "closed-loop": {"max_concurrency", "num_warmup_requests"},
    }.get(run, set())
    assert expected <= set(summary)
    assert summary["completed"] + summary["failed"] + summary["rejected"] > 0
