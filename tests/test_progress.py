"""What a user sees before and while a run goes: an estimate when it will be long, progress lines when
the output is not a terminal."""

from __future__ import annotations

from cluster import progress
from cluster.config_load import load_designs
from cluster.estimate import RUNNER_PREFILL_TOKENS_PER_WALL_S, estimate_line
from cluster.progress import RunProgress


def test_a_long_run_is_estimated_up_front_and_a_short_one_is_not():
    quick = load_designs("guide-l40s", ["pd-fast"], ["workload.num_requests=20"])
    assert estimate_line(quick, None) is None  # compute skip, virtual: seconds
    real = load_designs("guide-l40s", ["pd-fast"], ["runner.compute=real", "workload.num_requests=200"])
    line = estimate_line(real, None)
    prompt_tokens = 200 * real[0].workload.prompt_len
    assert line is not None and f"{prompt_tokens:,} prompt tokens" in line
    assert f"at least {prompt_tokens / RUNNER_PREFILL_TOKENS_PER_WALL_S:.0f} s wall" in line
    three = load_designs("guide-l40s", None, ["runner.compute=real", "workload.num_requests=200"])
    alone = estimate_line(three, None)
    together = estimate_line(three, None, num_parallel=3)  # designs in parallel processes
    assert alone is not None and together is not None and alone != together
    live = load_designs("guide-l40s", ["collocated"], ["clock.mode=live", "clock.time_scale=2"])
    assert "x time_scale 2" in (estimate_line(live, None) or "")


def test_progress_goes_as_lines_when_the_output_is_not_a_terminal(capsys, monkeypatch):
    monkeypatch.setattr(progress, "LINE_EVERY_WALL_S", 0.0)
    with RunProgress("pd-fast: requests", 3) as p:
        p.advance()
        p.describe("pd-fast: t=1.0 s emulated")
        p.advance(2)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("pd-fast: requests: 0/3 after")  # at once: what it does
    assert lines[1].startswith("pd-fast: requests: 1/3 after")
    assert lines[-1].startswith("pd-fast: t=1.0 s emulated: 3/3 after") and lines[-1].endswith(": done")
