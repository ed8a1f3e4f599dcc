"""The CLI as a user meets it: run directories, record shapes, and one-line errors for bad input."""

import importlib.metadata
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cluster.cli import build_parser, main
from cluster.cli_args import ABOUT
from cluster.config_load import PRESETS_DIR, available_presets
from dashboards.console import run_table, show, sweep_table
from dashboards.exposition import sample_values
from tests.factories import TRACES

BENCH_KEYS = {
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_tpot_ms",
    "median_e2el_ms",
    "request_throughput",
    "completed",
}
OUR_KEYS = {
    "design",
    "rate",
    "max_gap_ms",
    "median_handoff_ms",
    "p99_handoff_ms",
    "slo_attainment",
    "goodput",
}
SMALL = [
    "--compute",
    "skip",
    "--num-requests",
    "6",
    "--set",
    "workload.prompt_len=512",
    "--set",
    "workload.output_len=16",
]


def test_run_writes_a_reproducible_run_directory(tmp_path, capsys):
    assert main(["run", "--preset", "guide-l40s", "--rate", "2", *SMALL, "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "summary.json").read_text())
    assert [r["design"] for r in records] == ["collocated", "pd-testbox", "pd-fast"]
    for r in records:
        assert set(r) >= BENCH_KEYS | OUR_KEYS
        assert r["completed"] == 6
        assert set(r["slo_attainment"]) == {"ttft<=2s,tpot<=30ms", "ttft<=2s,gap<=100ms"}
    cfg = yaml.safe_load((tmp_path / "configs" / "pd-fast.yaml").read_text())
    assert cfg["kv_transfer"]["link"] == "rdma-400g" and cfg["workload"]["prompt_len"] == 512
    df = pd.read_parquet(tmp_path / "results.parquet")
    assert len(df) == 18 and {"ttft_s", "token_times_s", "finished_reason", "engine"} <= set(df.columns)
    assert "pd-testbox" in capsys.readouterr().out
    assert (tmp_path / "metrics" / "pd-fast" / "decode-0.prom").exists()
    _assert_report(tmp_path, {"ttft_cdf", "itl_cdf", "stalls", "handoff", "ttft_parts"})


def _assert_report(out, plots):
    """A self-contained page: every plot embedded (no file or network reference), and as a PNG."""
    page = (out / "report.html").read_text()
    assert {p.stem for p in (out / "plots").glob("*.png")} == plots
    for name in plots:
        assert (out / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f'alt="{name}" src="data:image/png;base64,' in page
    assert page.count("<img") == len(plots) and "http" not in page


def test_sweep_writes_means_over_seeds_and_goodput(tmp_path):
    args = [
        "sweep",
        "--design",
        "collocated,pd-fast",
        "--rates",
        "1,4",
        "--seeds",
        "2",
        "--jobs",
        "1",
        *SMALL,
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 0
    records = json.loads((tmp_path / "summary.json").read_text())
    assert {(r["design"], r["rate"]) for r in records} == {
        (d, x) for d in ("collocated", "pd-fast") for x in (1, 4)
    }
    assert all(r["num_seeds"] == 2 and set(r) >= BENCH_KEYS | OUR_KEYS for r in records)
    assert len(json.loads((tmp_path / "runs.json").read_text())) == 8
    goodput = json.loads((tmp_path / "goodput.json").read_text())
    assert set(goodput) == {"collocated", "pd-fast"}
    _assert_report(tmp_path, {"ttft_cdf", "itl_cdf", "stalls", "handoff", "ttft_parts", "goodput"})


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["run", "--preset", "nope"], ["preset", "'nope'", "guide-l40s"]),
        (["run", "--set", "pools.mixed.gpu=v100"], ["pools.mixed.gpu", "'v100'", "l40s"]),
        (["run", "--set", "target.model=gpt-5"], ["target.model", "'gpt-5'", "qwen2.5-7b"]),
        (
            ["run", "--set", "kv_transfer.link=carrier-pigeon"],
            ["kv_transfer.link", "carrier-pigeon", "nvlink"],
        ),
        (["run", "--rate", "0"], ["workload.rate", "0", "> 0"]),
        (["run", "--rate", "-1"], ["workload.rate", "-1"]),
        (["sweep", "--rates", "0.2,-1"], ["--rates", "0.2,-1", "> 0"]),
        (["sweep", "--rates", "fast"], ["--rates", "fast"]),
        (["sweep", "--rates", "0.2,,0.4"], ["--rates='0.2,,0.4'", "an empty item", "e.g. 0.2,0.4"]),
        (["sweep", "--rates", "0.2,0.4,"], ["--rates='0.2,0.4,'", "an empty item"]),
        (
            ["run", "--set", "scheduler.max_num_batched_tokens=8"],
            ["max_num_batched_tokens", "8", "block_size"],
        ),
        (["run", "--set", "scheduler.max_num_batched_tokens"], ["--set", "malformed", "dotted.key=value"]),
        (["run", "--set", "scheduler.budget=5"], ["scheduler.budget", "max_num_batched_tokens"]),
        (["run", "--set", "workload.rate=fast"], ["workload.rate", "'fast'"]),
        (["run", "--set", "runner.compute=maybe"], ["runner.compute", "'maybe'", "real"]),
        (["run", "--design", "pd-slow"], ["design", "pd-slow", "pd-fast"]),
        (["run", "--set", "pools.mixed.replicas=1", "--design", "pd-fast"], ["pools", "mixed=1"]),
        (["run", "--set", "target.model=llama-3.1-70b"], ["pools.mixed", "llama-3.1-70b", "tp"]),
        (["run", "--set", "scheduler.max_waiting=0"], ["scheduler.max_waiting", "0", ">= 1"]),
        (
            ["run", "--set", "scheduler.max_num_queued_tokens=-5"],
            ["scheduler.max_num_queued_tokens", "-5", ">= 0"],
        ),
        (
            ["run", "--set", "faults.link_slowdowns=[{start_s: 5, end_s: 1, bandwidth_factor: 0.5}]"],
            ["faults.link_slowdowns", "end_s=1", "start_s < end_s"],
        ),
        (
            ["run", "--set", "faults.kv_transfer_failure_rate=2"],
            ["faults.kv_transfer_failure_rate", "2", "[0, 1]"],
        ),
        (
            ["run", "--design", "pd-fast", "--set", "faults.engine_kills=[{engine: prefill-1, at_s: 3}]"],
            ["faults.engine_kills", "'prefill-1'", "prefill-0, decode-0"],
        ),
        (
            ["run", "--design", "pd-fast", "--set", "faults.engine_hangs=[{engine: decode-0, at_s: 3}]"],
            ["faults.engine_hangs", "'decode-0'", "no such prefill engine", "prefill-0"],
        ),
        (
            ["run", "--design", "pd-fast", "--set", "faults.engine_hangs=[{engine: prefill-0, at_s: 3}]"],
            ["faults.engine_hangs", "router.prefill_timeout_s", "for ever"],
        ),
        (["run", "--set", "router.prefill_timeout_s=0"], ["router.prefill_timeout_s", "0", "> 0"]),
        (["run", "--set", "scheduler.max_queue_time_s=-2"], ["scheduler.max_queue_time_s", "-2", "> 0"]),
        (["run", "--set", "clock.max_sync_uncertainty_s=0"], ["clock.max_sync_uncertainty_s", "0", "> 0"]),
        (  # as vLLM refuses a max_model_len the KV cache cannot hold (it would wait forever)
            ["run", "--set", "scheduler.num_gpu_blocks_override=1200"],
            ["scheduler.num_gpu_blocks_override", "1200", "max_model_len=32768", "2048 blocks"],
        ),
        (["run", "--set", "slos=[ttft<=fast]"], ["slos", "ttft<=fast"]),
        (["run", "--compute", "skip", "--output-policy", "greedy"], ["greedy", "compute"]),
        (["run", "--set", "clock.stream_flush_wall_s=-1"], ["clock.stream_flush_wall_s", "-1", ">= 0"]),
        (["run", "--mode", "live", "--address", "nonsense"], ["--address", "nonsense", "HOST:PORT"]),
        (["serve", "--ray", "--address", "127.0.0.1:1"], ["--address", "127.0.0.1:1", "no Ray head answers"]),
    ],
)
def test_bad_input_is_one_clear_line(args, needles, capsys, tmp_path):
    assert main([*args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


def test_console_script_reports_errors_without_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "run", "--preset", "missing"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "preset" in proc.stderr


def _ray_processes() -> list[str]:
    proc = subprocess.run(["pgrep", "-fa", "raylet|gcs_server|plasma_store"], capture_output=True, text=True)
    return [line for line in proc.stdout.splitlines() if "pgrep" not in line]


@pytest.mark.full  # a live Ray: `make test`, not `make test-fast`
def test_live_run_starts_ray_and_leaves_nothing_behind(tmp_path):
    assert _ray_processes() == [], "another Ray is running; this test needs the host to itself"
    args = [
        "run",
        "--mode",
        "live",
        "--design",
        "collocated",
        "--compute",
        "skip",
        "--num-requests",
        "4",
        "--rate",
        "2",
        "--set",
        "workload.prompt_len=1024",
        "--set",
        "workload.output_len=16",
        "--set",
        f"metrics.sd_file={tmp_path / 'targets.json'}",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "cluster.cli", *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (record,) = json.loads((tmp_path / "summary.json").read_text())
    assert record["completed"] == 4 and record["time_scale"] == 1.0 and "lag_fraction" in record
    proxy = (tmp_path / "metrics" / "collocated" / "proxy.prom").read_text()
    assert 'testbed:requests_finished_total{engine="0",finished_reason="length"' in proxy
    assert (
        "vllm:generation_tokens_total" in (tmp_path / "metrics" / "collocated" / "mixed-0.prom").read_text()
    )
    assert json.loads((tmp_path / "targets.json").read_text()) == []  # targets withdrawn at the end
    time.sleep(1.0)
    assert _ray_processes() == []


@pytest.mark.parametrize(
    ("config", "needles"),
    [
        ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}, ["Qwen3ForCausalLM"]),
        ({"architectures": ["LlamaForCausalLM"]}, ["LlamaForCausalLM"]),
        ({"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True}, ["use_sliding_window"]),
    ],
)
def test_a_model_the_runner_cannot_compute_is_refused_in_one_line(config, needles, capsys, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    assert main(["run", "--set", f"runner.model_path={model}", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for needle in ["runner.model_path", str(model), "allowed: Qwen2ForCausalLM", *needles]:
        assert needle in err, (needle, err)


WEKA_0007 = str(TRACES / "weka_claude_code" / "trace_0007.json")


def test_replay_writes_the_run_directory_with_sessions_and_reuse(tmp_path):
    argv = ["replay", "--preset", "agentic-h200", "--trace", WEKA_0007, "--compute", "skip"]
    assert main([*argv, "--router", "kv_aware", "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "summary.json").read_text())
    assert [r["design"] for r in records] == ["collocated", "pd"]
    for r in records:
        assert r["completed"] == 12 and r["trace"] == "trace_0007" and r["num_sessions"] == 1
        # one session, kv_aware: near an infinite cache's (finer engine blocks can hit a bit more)
        assert r["prefix_hit_rate"] == pytest.approx(r["theoretical_prefix_hit_rate_with_answers"], abs=0.02)
        assert set(r["median_ttft_ms_by_turn"]) == {str(k) for k in range(12)}
    df = pd.read_parquet(tmp_path / "results.parquet")
    assert df["session_id"].eq("trace_0007").all() and sorted(df["turn"].unique()) == list(range(12))
    cfg = yaml.safe_load((tmp_path / "configs" / "pd.yaml").read_text())
    assert cfg["router"]["policy"] == "kv_aware" and cfg["replay"]["trace"] == WEKA_0007
    _assert_report(
        tmp_path,
        {"ttft_cdf", "itl_cdf", "stalls", "handoff", "ttft_parts", "ttft_by_turn", "ttft_by_context"},
    )


def test_a_replay_parses_its_trace_and_measures_its_reuse_once_for_all_its_designs(tmp_path, monkeypatch):
    from cluster import sweep
    from workloads import replay
    from workloads.traces import load_trace
    from workloads.traces.prefix_reuse import theoretical_hit_rate

    parses = []
    measures = []

    def counting_load(*args, **kwargs):
        parses.append(args[0])
        return load_trace(*args, **kwargs)

    def counting_measure(*args, **kwargs):
        measures.append(kwargs)
        return theoretical_hit_rate(*args, **kwargs)

    monkeypatch.setattr(replay, "load_trace", counting_load)
    monkeypatch.setattr(replay, "theoretical_hit_rate", counting_measure)
    monkeypatch.setattr(sweep.os, "cpu_count", lambda: 1)  # the designs in this process, counted here
    argv = ["replay", "--preset", "agentic-h200", "--trace", WEKA_0007, "--compute", "skip"]
    assert main([*argv, "--max-turns", "3", "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "summary.json").read_text())
    assert [r["design"] for r in records] == ["collocated", "pd"]
    assert parses == [WEKA_0007]
    assert measures == [{}, {"with_answers": True}]  # prompts only, and with answers


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace", "nope.jsonl"], "replay.trace='nope.jsonl': no such file or directory"),
        (["--trace", WEKA_0007, "--router", "magic"], "router.policy"),
        (["--trace", WEKA_0007, "--window", "5"], "--window='5': expected START:END"),
        ([], "give --trace PATH or --scenario NAME"),
    ],
)
def test_replay_bad_input_is_one_line(argv, message, capsys):
    assert main(["replay", "--compute", "skip", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_replay_of_a_broken_trace_names_file_line_and_field(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [1]}\n')
    assert main(["replay", "--compute", "skip", "--trace", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:1: output_length: 0: expected an integer >= 1" in err and err.count("\n") == 1


def test_a_run_of_several_designs_in_worker_processes_matches_each_run_alone():
    from cluster.cli_run import _run_virtual_designs
    from cluster.config_load import load_designs
    from cluster.virtual import run_virtual

    configs = load_designs("guide-l40s", None, ["runner.compute=skip", "workload.num_requests=8"])
    parallel = _run_virtual_designs(configs, None)
    for cfg, out in zip(configs, parallel, strict=True):
        alone = run_virtual(cfg)
        assert out.summary == alone.summary and out.engine_reports == alone.engine_reports
        assert out.results.equals(alone.results) and out.metrics.keys() == alone.metrics.keys()
        for actor, text in out.metrics.items():  # the same counts (each series' `_created` time aside)
            assert sample_values(text) == sample_values(alone.metrics[actor]), actor


def _trace_presets() -> set[str]:
    """The presets whose workload is a trace they do not name, read from their YAML."""
    out = set()
    for name in available_presets():
        raw = yaml.safe_load((PRESETS_DIR / f"{name}.yaml").read_text())
        base = raw.get("base", raw)
        if base.get("workload", {}).get("kind") == "trace" and not base.get("replay", {}).get("trace"):
            out.add(name)
    return out


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["--preset", "offload-h200"], "testbed replay --preset offload-h200 --trace FILE"),
        (
            ["--preset", "agentic-h200", "--design", "pd"],
            "testbed replay --preset agentic-h200 --design pd --trace FILE",
        ),
    ],
)
def test_run_of_a_trace_preset_answers_with_the_replay_command(argv, command, capsys):
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --preset={argv[1]} replays a trace; run it with: {command}\n"


def test_run_of_a_trace_config_answers_with_the_replay_command(tmp_path, capsys):
    config = tmp_path / "mine.yaml"
    config.write_text("workload: {kind: trace}\n")
    assert main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    command = f"testbed replay --config {config} --trace FILE"
    assert err == f"error: --config={config} replays a trace; run it with: {command}\n"


def test_presets_marks_those_that_replay_a_trace(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert _trace_presets() == {"agentic-h200", "offload-h200"}
    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in available_presets():
        row = next(i for i, line in enumerate(lines) if line.startswith(f"│ {name} "))
        marked = lines[row + 1].startswith("│ (replay --trace) ")
        assert marked == (name in _trace_presets()), (name, lines[row : row + 2])
    assert any("(replay --trace): run it as testbed replay --preset NAME --trace FILE" in x for x in lines)


def test_version_is_the_installed_distributions(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"testbed {importlib.metadata.version('disagg-testbed')}\n"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("base:\n  workload: [1, 2\n  scheduler: 3\n",
         "3:12: not valid YAML: expected ',' or ']', but got ':' (while parsing a flow sequence at 2:13)"),
        ("seed: 1\nworkload:\n\tkind: trace\n", "3:1: not valid YAML: found character '\\t' that cannot "
         "start any token (while scanning for the next token)"),
        ("seed: 1\nworkload: kind: trace\n", "2:15: not valid YAML: mapping values are not allowed here"),
    ],
)  # fmt: skip
def test_a_broken_yaml_config_is_one_line_with_file_line_and_column(text, where, tmp_path, capsys):
    config = tmp_path / "broken.yaml"
    config.write_text(text)
    assert main(["run", "--config", str(config)]) == 2
    assert capsys.readouterr().err == f"error: config: {config}:{where}\n"


def test_every_subcommand_has_help_with_a_description_and_examples(capsys):
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices or {}
    assert set(ABOUT) == set(commands)  # a new subcommand gets its help here
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for name, (_, description, examples) in ABOUT.items():
        assert main([name, "--help"]) == 0
        out = capsys.readouterr().out
        assert " ".join(description.split()) in " ".join(out.split()), name
        assert re.search(r"^examples?:$", out, re.M), name
        for example in examples:
            assert f"\n  {example}\n" in f"{out}\n" and example in readme, example  # runs as the README's
            argv = shlex.split(example)
            assert build_parser().parse_args(argv[1:]).command == name == argv[1]
    assert main(["sweep", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(default: 0.2,0.4,0.6,1.0,1.5,2.0)" in help_text and "(default: guide-l40s)" in help_text


def test_the_run_summary_fits_a_terminal_of_100_columns(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["run", "--preset", "guide-l40s", *SMALL, "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[: next(i for i, x in enumerate(lines) if x.startswith("run directory: "))]
    assert max(len(x) for x in table) <= 100, "\n".join(table)
    for design in ("collocated", "pd-testbox", "pd-fast"):  # whole names, whole values
        assert any(re.search(f"│ +{design} │", x) for x in table), design
    assert any("left out at 100 columns: lag %, time scale" in x for x in table)
    assert "…" not in "".join(table)


def test_summary_tables_fit_the_terminal_without_cutting_a_value(capsys, monkeypatch):
    designs = ["collocated-host", "collocated-shared", "pd-bidirectional-host"]
    keys = ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "max_gap_ms", "median_handoff_ms")
    records = [
        {"design": d, "rate": rate, "completed": 1200, "failed": 3, "rejected": 17,
         "request_throughput": 3.456, "time_scale": 1.0, "lag_fraction": 0.0, **{k: 12345.6 for k in keys}}
        for d in designs
        for rate in (0.5, 1.0, 2.0)
    ]  # fmt: skip
    for columns in (100, 80):
        monkeypatch.setenv("COLUMNS", str(columns))
        show(run_table(records[:3]), sweep_table(records, "a sweep of three designs"))
        out = capsys.readouterr().out
        assert max(len(x) for x in out.splitlines()) <= columns, out
        assert all(d in out for d in designs) and "12345.6" in out and "…" not in out
    monkeypatch.setenv("COLUMNS", "200")
    show(run_table(records[:3]))
    out = capsys.readouterr().out
    assert "lag %" in out and "left out" not in out  # a wide terminal shows every column
