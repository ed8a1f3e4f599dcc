"""What a run says of itself on the terminal: failed requests, one warning line per design with the
count and the top reasons in words, grouped by kind."""

import html
import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from cluster.cli import main
from tests.factories import TRACES

RUN = ["run", "--preset", "guide-l40s", "--compute", "skip", "--num-requests", "5"]
MOONCAKE = TRACES / "mooncake_fast25" / "conversation_trace.window_0s_1200s.jsonl"


def _page_text(path) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", path.read_text())).split())


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning:")]


def test_failed_requests_are_one_warning_line_per_design_grouped_by_kind(tmp_path, capsys):
    """The Mooncake window's first 20 s with a 16k context: the prompts over it are one reason with a
    count, in each design."""
    args = ["replay", "--preset", "offload-h200", "--trace", str(MOONCAKE), "--window", "0:20"]
    designs = "collocated,pd-bidirectional-host"
    args += ["--design", designs, "--compute", "skip", "--set", "scheduler.max_model_len=16384"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    lines = _warnings(capsys.readouterr().err)
    assert [line.split(":")[1].strip() for line in lines] == designs.split(",")
    counts = set()
    for line in lines:
        m = re.fullmatch(r"warning: [\w-]+: (\d+) of (\d+) succeeded: (\d+) × (.*)", line)
        assert m, line
        assert m[4] == "Prompt and max_tokens exceed max_model_len (16384)"
        assert int(m[1]) + int(m[3]) == int(m[2]) and int(m[3]) > 1
        counts.add(m[3])
    assert len(counts) == 1  # the same prompts fail in both designs


def test_a_pull_that_finds_no_kv_held_is_said_in_words(tmp_path, capsys):
    """Prefill lets go of the KV before decode pulls it: the reason names both engines and the cause,
    never a Python repr or a request ID."""
    args = [*RUN, "--design", "pd-fast", "--set", "kv_transfer.hold_timeout_s=0.000001"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    (line,) = _warnings(capsys.readouterr().err)
    assert re.fullmatch(
        r"warning: pd-fast: \d of 5 succeeded: \d × decode-0 could not pull KV from prefill-0: "
        r"prefill no longer held it",
        line,
    ), line


def test_a_sweep_with_failed_requests_says_so_per_design(tmp_path, capsys):
    args = ["sweep", "--preset", "guide-l40s", "--design", "pd-fast", "--compute", "skip", "--rates", "1,2"]
    args += ["--num-requests", "5", "--jobs", "1", "--set", "kv_transfer.hold_timeout_s=0.000001"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    (line,) = _warnings(capsys.readouterr().err)
    assert re.fullmatch(r"warning: pd-fast: \d+ of 10 succeeded: \d+ × decode-0 could not pull KV .*", line)


def test_a_run_where_every_request_succeeds_warns_of_nothing_and_says_when_it_writes_its_report(
    tmp_path, capsys
):
    assert main([*RUN, "--design", "collocated", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert not _warnings(err)
    num_plots = len(list((tmp_path / "plots").glob("*.png")))
    assert "writing report: plots: 0 after 0 s wall\n" in out  # at once
    assert re.search(rf"^writing report: plots: {num_plots} after \d+ s wall: done$", out, re.MULTILINE)


def _strict(path):
    def refuse(constant):
        raise AssertionError(f"{path.name}: {constant} is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_rate_inf_sends_every_request_at_once_and_writes_strict_json(tmp_path):
    """`--rate inf` as `vllm bench serve --request-rate inf`: every request arrives at t = 0; the
    summary, report and results are written, every figure in JSON finite or null."""
    assert main([*RUN, "--rate", "inf", "--out", str(tmp_path)]) == 0
    df = pd.read_parquet(tmp_path / "results.parquet")
    assert (df["arrival_s"] == 0).all() and df["ok"].all() and np.isinf(df["rate"]).all()
    for path in tmp_path.glob("*.json"):
        _strict(path)
    assert [r["rate"] for r in _strict(tmp_path / "summary.json")] == [None, None, None]
    assert "At inf req/s" in (tmp_path / "report.html").read_text()


REPLAY = ["replay", "--preset", "offload-h200", "--trace", str(MOONCAKE), "--compute", "skip"]


def test_a_window_outside_the_trace_is_one_line_naming_its_span(tmp_path, capsys):
    assert main([*REPLAY, "--window", "5000:6000", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "window: [5000, 6000) s holds no session; its sessions start between 0 and 1200 s" in err


def test_a_replay_counts_the_window_it_sent_and_its_prefix_hits_beside_the_ideal(tmp_path, capsys):
    """The Mooncake window's first 120 s: 339 requests at about 2.9 req/s (the whole window is 3,658
    at 3.05); the report says so, and sets the hits found beside an infinite cache's."""
    assert main([*REPLAY, "--window", "0:120", "--design", "collocated", "--out", str(tmp_path)]) == 0
    (record,) = json.loads((tmp_path / "summary.json").read_text())
    assert record["completed"] == 339 and record["num_sessions"] == 339
    assert 2.8 < record["rate"] < 3.0
    page = _page_text(tmp_path / "report.html")
    assert "window 0-120 s: 339 sessions, 339 requests at 2.9 req/s" in page
    m = re.search(
        r"Prompt tokens found cached: collocated ([\d.]+ %); an infinite cache would find ([\d.]+ %)", page
    )
    assert m, page[:2000]
    assert float(m[2].rstrip(" %")) == pytest.approx(100 * record["theoretical_prefix_hit_rate"], abs=0.05)
    assert float(m[1].rstrip(" %")) == pytest.approx(100 * record["prefix_hit_rate"], abs=0.05)
    ideal = record["theoretical_prefix_hit_rate_with_answers"]  # (one-turn sessions: no answer repeated)
    assert ideal == record["theoretical_prefix_hit_rate"]
    hits = f"{100 * record['prefix_hit_rate']:.1f} ({100 * ideal:.1f})"
    assert hits in capsys.readouterr().out  # the terminal table's column


def test_a_sweep_of_a_trace_preset_says_how_and_sweeps_its_speedup(tmp_path, capsys):
    """Without a trace: the command to use, in one line. With one: each of `--rates` is a speedup of
    the trace, a point each (they once collapsed into one record at the trace's own rate)."""
    assert main(["sweep", "--preset", "offload-h200", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "error: --preset=offload-h200 replays a trace; sweep its speedup with: testbed sweep "
        "--preset offload-h200 --set replay.trace=FILE --rates 0.5,1,2\n"
    )
    args = ["sweep", "--preset", "offload-h200", "--design", "collocated", "--rates", "0.5,1", "--jobs", "1"]
    args += ["--set", f"replay.trace={MOONCAKE}", "--set", "replay.window_s=[0,30]", "--compute", "skip"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    slow, fast = json.loads((tmp_path / "summary.json").read_text())
    assert fast["rate"] == pytest.approx(2 * slow["rate"]) and slow["completed"] == fast["completed"] > 0


def test_a_rate_of_inf_has_a_place_of_its_own_on_the_goodput_curves():
    """Swept with `--rates 1,inf`: inf is drawn a quarter past the highest finite rate, its tick
    labelled, not dropped as a point matplotlib cannot place."""
    from dashboards.report_plots import goodput_curves

    records = [
        {"design": "a", "rate": rate, "slo_attainment": {"ttft<=2s": share}, "goodput": {"ttft<=2s": share}}
        for rate, share in ((0.5, 1.0), (2.0, 0.8), (math.inf, 0.1))
    ]
    fig = goodput_curves(records)
    assert fig is not None
    for ax in fig.axes:
        (line,) = [ln for ln in ax.get_lines() if ln.get_gid() == "a"]
        assert list(line.get_xdata()) == [0.5, 2.0, 2.5]
        assert [t.get_text() for t in ax.get_xticklabels()][-1] == "inf"
