"""Factories for tests: small configs, requests and virtual-time runs built from the real classes."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import uvicorn

from actors.engine.clock import VirtualTimeLoop
from cluster.config_load import build_config, load_designs
from cluster.serve import build_server
from cluster.virtual import Deployment, serve
from emulation.config import TestbedConfig
from messages import ClientRequest, RequestResult
from workloads.replay import Workload, workload_for

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
"""The public trace excerpts beside the project (`../shared/traces`)."""
SIX_TURN: dict[str, Any] = {
    "num_conversations": 1,
    "num_turns": "constant:6",
    "common_prefix_tokens": 0,
    "prefix_tokens": "constant:3600",
    "user_tokens": "constant:400",
    "output_tokens": "constant:600",
    "think_s": "constant:1",
}
"""`multi_turn` of one six-turn chat: a 4,000-token first prompt, answers of 600, follow-ups of 400."""
COLLOCATED: dict[str, Any] = {"pools": {"mixed": {"replicas": 1}}}
PD: dict[str, Any] = {
    "pools": {"mixed": {"replicas": 0}, "prefill": {"replicas": 1}, "decode": {"replicas": 1}}
}


def make_config(*layers: dict[str, Any], **sections: Any) -> TestbedConfig:
    """A validated config: defaults, then each layer, then keyword sections (deep-merged)."""
    raw: dict[str, Any] = {}
    for layer in (*layers, sections):
        _merge(raw, layer)
    return build_config(raw)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> None:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = copy.deepcopy(v)  # a later layer merges into it: never into the caller's dict


def make_requests(
    num: int,
    prompt_len: int | Sequence[int],
    max_tokens: int,
    vocab: int = 8192,
    seed: int = 0,
    gap_s: float = 0.5,
    forced: bool = False,
) -> list[ClientRequest]:
    rng = np.random.default_rng(seed)
    lens = [prompt_len] * num if isinstance(prompt_len, int) else list(prompt_len)
    return [
        ClientRequest(
            request_id=f"r{i}",
            arrival_s=i * gap_s,
            prompt_token_ids=rng.integers(0, vocab, lens[i]).tolist(),
            max_tokens=max_tokens,
            forced_output_token_ids=rng.integers(0, vocab, max_tokens).tolist() if forced else None,
        )
        for i in range(num)
    ]


def run_requests(cfg: TestbedConfig, requests: Workload | None) -> tuple[list[RequestResult], Deployment]:
    """Serve `requests` (a trace's sessions; None: the config's workload) on a fresh virtual deployment;
    engines are checked empty afterwards."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(serve(cfg, requests if requests is not None else workload_for(cfg)))
    finally:
        loop.close()


def run_async(coro: Any) -> Any:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


class ServeThread:
    """A `testbed serve` app on a free loopback port, in a thread, until `stop()`."""

    def __init__(self, *overrides, design="pd-fast", **kwargs):
        cfg = load_designs(
            "guide-l40s",
            [design],
            ["runner.compute=skip", "workload.prompt_len=512", "workload.output_len=24", *overrides],
        )[0]
        self.served = build_server(cfg, **kwargs)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.served.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)

    def stop(self):
        """Shut down; the app's lifespan checks every engine and render stream empty."""
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive()

    def engines_idle(self):
        return all(not e._requests and not e.scheduler.held for e in self.served.engines)

    def leave_mid_stream(self, idle, timeout_s=10.0, stream=True):
        """Start a long chat, read a few events and hang up (not `stream`: wait a second for the whole
        answer and hang up); wait until its result is recorded and `idle()`; returns the result."""
        before = len(self.served.frontend.results)
        body = {
            "model": self.served.frontend.model_name,
            "messages": [{"role": "user", "content": "a long one"}],
            "max_tokens": 400,
            "stream": stream,
        }
        url = f"{self.url}/v1/chat/completions"
        if stream:
            with httpx.stream("POST", url, json=body) as s:
                lines = s.iter_lines()
                for _ in range(6):
                    next(lines)
        else:
            with contextlib.suppress(httpx.ReadTimeout):
                httpx.post(url, json=body, timeout=httpx.Timeout(10.0, read=1.0))
        deadline = time.monotonic() + timeout_s
        while len(self.served.frontend.results) == before or not idle():
            assert time.monotonic() < deadline, "the abandoned request is still running"
            time.sleep(0.1)
        return self.served.frontend.results[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SWE_AGENT = TRACES / "swebench_mini_swe_agent_gemini3" / "trajs"


def swe_agent_through_serve(
    tmp: Path, design: str, *sets: str, window: str = "0:3", max_turns: int = 3, time_scale: float = 0.2
) -> Any:
    """The SWE-agent sessions starting in `window` (trace seconds), `max_turns` each, on their own
    answers (`replay.history=model`) through `testbed serve --preset six-turn-l40s --design design`
    (a process of its own, compute skip, `time_scale`), `sets` given to the client; the server's own
    results (a pandas frame) in send order, each row's `turn` counted per session from 1."""
    import pandas as pd

    from cluster.cli import main

    port = free_port()
    args = ("--preset", "six-turn-l40s", "--design", design)
    proc = serve_process(
        port, tmp / "server", "scheduler.max_model_len=65536", design=(*args, "--time-scale", str(time_scale))
    )
    try:
        argv = ["replay", "--trace", str(SWE_AGENT), "--target", f"http://127.0.0.1:{port}", *args[:2],
                "--window", window, "--max-turns", str(max_turns), "--set", "replay.history=model",
                "--out", str(tmp / "client")]  # fmt: skip
        for s in sets:
            argv += ["--set", s]
        assert main(argv) == 0
    finally:
        stop_serve(proc)
    client = pd.read_parquet(tmp / "client" / "results.parquet")
    assert client["ok"].all(), client.loc[~client["ok"], ["finished_reason", "error"]].head().to_string()
    df = pd.read_parquet(tmp / "server" / "results.parquet").sort_values("arrival_s")
    assert df["ok"].all()
    return df.assign(turn=df.groupby("session_id").cumcount() + 1)


__all__ = [
    "COLLOCATED",
    "PD",
    "SWE_AGENT",
    "ServeThread",
    "asyncio",
    "free_port",
    "make_config",
    "make_requests",
    "run_async",
    "run_requests",
    "swe_agent_through_serve",
]


def serve_process(
    port: int, out: Path, *sets: str, design: tuple[str, ...] = ("--design", "pd-fast")
) -> subprocess.Popen[str]:
    """`testbed serve` (`design`: its arguments; compute skip) in a process of its own on `port`,
    writing its results to `out` when stopped (SIGINT); returned once it answers /health."""
    cmd = [sys.executable, "-m", "cluster.cli", "serve", *design, "--compute", "skip",
           "--port", str(port), "--out", str(out)]  # fmt: skip
    for s in (f"metrics.sd_file={out / 'targets.json'}", *sets):
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc
        except httpx.TransportError:
            assert time.monotonic() < deadline, "serve never answered /health"
            time.sleep(0.2)


def stop_serve(proc: subprocess.Popen[str], timeout_s: float = 120.0) -> tuple[str, str]:
    """Stop a `serve_process` as its users do (Ctrl-C): it says so in one line and exits 130; its
    stdout and stderr."""
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 130, err[-2000:]
    assert err.splitlines()[-1].startswith("interrupted: ") and "Traceback" not in err, err[-2000:]
    return out, err


def cli_process(*argv: str, env: dict[str, str] | None = None) -> str:
    """`testbed ARGV` in a process of its own, as a user runs it; what it printed (stdout), once it exited
    0 (its stderr shown otherwise). `env`: variables set for it on top of this process's.

    For a command whose runs go to worker processes (a plan): they fork from an interpreter without
    torch, as a user's do. A pytest process has torch loaded (test modules import it), so the same
    command in it spawns each pool's workers, each starting from nothing again
    (`cluster.sweep._start_method`), and a plan's searches make a pool each: 2-10 times as long."""
    cmd = [sys.executable, "-m", "cluster.cli", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout
