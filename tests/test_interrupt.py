"""Ctrl-C during run, replay, sweep, plan or live: one line saying what finished and where it is, the
partial results and resolved configs written, no traceback, no "Task was destroyed but it is
pending", exit code 130, and no worker or Ray process left behind (serve: test_serve.py, stopped as
its users stop it).

Each test starts the command as a terminal would (its own process group, SIGINT to the group, as Ctrl-C
sends it to every process of the foreground job) once the command shows it is under way."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.factories import TRACES

MOONCAKE = TRACES / "mooncake_fast25" / "conversation_trace.window_0s_1200s.jsonl"
LINE = re.compile(
    r"interrupted: ([\d,]+)( of ([\d,]+))? (requests?|replays) finished; partial results in (\S+)"
)


def _start(args: list[str]) -> subprocess.Popen[str]:
    """`testbed ARGS` in a process group of its own, as a terminal's foreground job; its stdout and
    stderr as one stream."""
    return subprocess.Popen(
        [sys.executable, "-u", "-m", "cluster.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _interrupt(
    args: list[str], under_way: str, timeout_s: float = 120.0, group: bool = True, settle_s: float = 1.5
) -> tuple[str, list[str]]:
    """Run `testbed ARGS`, send Ctrl-C once its output has shown `under_way` and `settle_s` more (to its
    process group, as a terminal does; `group` False: to the command alone, as `kill -INT` does); its
    output and the processes of its group still alive after it exited."""
    proc = _start(args)
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + timeout_s
    for line in proc.stdout:
        seen.append(line)
        if under_way in line or time.monotonic() > deadline:
            break
    time.sleep(settle_s)
    (os.killpg if group else os.kill)(proc.pid, signal.SIGINT)
    out = "".join(seen) + proc.communicate(timeout=timeout_s)[0]
    assert proc.returncode == 130, out[-3000:]
    return out, _left_in_group(proc.pid)


def _left_in_group(pgid: int, wait_s: float = 10.0) -> list[str]:
    """The processes of group `pgid` still there after `wait_s` (a dead one is reaped in a moment)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = subprocess.run(["pgrep", "-a", "-g", str(pgid)], capture_output=True, text=True).stdout
        if not left or time.monotonic() > deadline:
            return left.splitlines()
        time.sleep(0.5)


def _one_line(out: str) -> re.Match[str]:
    """The command's last line, the one that says it was interrupted; nothing Python says of itself."""
    assert "Traceback" not in out and "Task was destroyed" not in out and "never retrieved" not in out, out
    lines = [line for line in out.splitlines() if line.strip()]
    m = LINE.fullmatch(lines[-1])
    assert m, out[-3000:]
    return m


def test_ctrl_c_during_a_replay_keeps_the_requests_finished(tmp_path):
    """One design in this process: the requests it finished are written, with the resolved config."""
    args = [
        "replay",
        "--preset",
        "offload-h200",
        "--trace",
        str(MOONCAKE),
        "--design",
        "pd-bidirectional-host",
    ]
    out, alive = _interrupt([*args, "--compute", "skip", "--out", str(tmp_path)], "requests: 0/")
    m = _one_line(out)
    assert m[3] == "3,658" and Path(m[5]) == tmp_path and not alive
    done = int(m[1].replace(",", ""))
    assert len(pd.read_parquet(tmp_path / "results.parquet")) == done > 0
    (record,) = json.loads((tmp_path / "summary.json").read_text())
    assert record["interrupted"] and record["completed"] + record["failed"] + record["rejected"] == done
    assert (tmp_path / "configs" / "pd-bidirectional-host.yaml").exists()


@pytest.mark.full  # a few seconds each: make test
@pytest.mark.parametrize("group", [True, False], ids=["terminal", "kill-parent"])
def test_ctrl_c_during_designs_in_worker_processes_keeps_what_each_finished(tmp_path, group):
    """Several designs in worker processes: each one under way keeps the requests it finished (the
    signal passed on to the workers where only the command got it); no worker is left."""
    # Each worker builds 20,000 requests and opens its GPU's kernel tables before its first step: 4 s
    # after "0/3" one had finished none on a slow host. A design of 3,000 requests runs in 4-6 s here,
    # so 20,000 run far past a 10 s wait.
    args = ["run", "--preset", "guide-l40s", "--compute", "skip", "--num-requests", "20000"]
    out, alive = _interrupt([*args, "--out", str(tmp_path)], "in parallel: 0/3", group=group, settle_s=10.0)
    m = _one_line(out)
    assert m[3] == "60,000" and not alive
    done = int(m[1].replace(",", ""))
    records = json.loads((tmp_path / "summary.json").read_text())
    assert len(records) == min(3, os.cpu_count() or 1)  # a worker a core, each design under way
    assert all(r["interrupted"] and r["completed"] > 0 for r in records)
    assert len(pd.read_parquet(tmp_path / "results.parquet")) == done
    assert len(list((tmp_path / "configs").glob("*.yaml"))) == 3


@pytest.mark.full
def test_ctrl_c_during_a_sweep_keeps_the_points_finished(tmp_path):
    args = ["sweep", "--preset", "guide-l40s", "--compute", "skip", "--rates", "0.5,1,2,3", "--seeds", "4"]
    out, alive = _interrupt([*args, "--num-requests", "100", "--out", str(tmp_path)], "48 runs: 0/")
    m = _one_line(out)
    assert m[3] == "4,800" and not alive
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert 0 < len(runs) < 48 and int(m[1].replace(",", "")) == 100 * len(runs)
    assert "stopped" in out and not (tmp_path / "report.html").exists()


@pytest.mark.full
def test_ctrl_c_during_a_plan_keeps_the_replays_run(tmp_path):
    args = ["plan", "--preset", "guide-l40s", "--num-requests", "100", "--seeds", "3"]
    args += ["--vary", "scheduler.max_num_batched_tokens=1024,2048,4096", "--out", str(tmp_path)]
    out, alive = _interrupt(args, "so far")
    m = _one_line(out)
    assert m[4] == "replays" and not alive
    replays = pd.read_parquet(tmp_path / "results.parquet").groupby(["candidate", "load", "seed"])
    assert len(replays) == int(m[1])
    assert len(list((tmp_path / "configs").glob("*.yaml"))) == 9


def _ray_processes() -> list[str]:
    proc = subprocess.run(["pgrep", "-fa", "raylet|gcs_server|plasma_store"], capture_output=True, text=True)
    return [line for line in proc.stdout.splitlines() if "pgrep" not in line]


@pytest.mark.full  # a live Ray
def test_ctrl_c_during_a_live_run_leaves_no_ray_behind(tmp_path):
    assert _ray_processes() == [], "another Ray is running; this test needs the host to itself"
    args = ["run", "--mode", "live", "--design", "collocated", "--compute", "skip", "--num-requests", "200"]
    args += ["--rate", "2", "--set", f"metrics.sd_file={tmp_path / 'targets.json'}", "--out", str(tmp_path)]
    out, alive = _interrupt(args, "requests: 0/", 300)  # deployed: its requests are due
    m = _one_line(out)
    assert m[3] == "200" and not alive
    time.sleep(2)
    assert _ray_processes() == []
    assert (tmp_path / "configs" / "collocated.yaml").exists()
