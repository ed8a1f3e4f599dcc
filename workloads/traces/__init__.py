"""Trace loaders: each turns one trace family's file into sessions of turns (`session.Trace`).

mooncake   JSONL, hash IDs of 512-token blocks, optional session_id / delay   (mooncake.py)
azure      CSV arrivals and lengths, no prefix information                    (azure.py)
weka       JSON per agentic session, 64-token hash IDs, sub-agents            (weka.py)
swe-agent  mini-SWE-agent trajectories: full chat text, rendered when sent  (swe_agent.py)
servegen   per-client rate/burstiness fits and length PMFs, sampled         (servegen.py)
"""

from __future__ import annotations

from pathlib import Path

from workloads.traces.azure import load_azure
from workloads.traces.mooncake import load_mooncake
from workloads.traces.servegen import load_servegen
from workloads.traces.session import Trace, TraceError
from workloads.traces.swe_agent import load_swe_agent
from workloads.traces.weka import load_weka

FORMATS = ("mooncake", "azure", "weka", "swe-agent", "servegen")


def detect_format(path: str | Path) -> str:
    """A trace's format from its name (a directory or `.json`: weka; `.jsonl`: mooncake; `.csv`: azure),
    else from its first line."""
    p = Path(path)
    by_suffix = {".json": "weka", ".jsonl": "mooncake", ".csv": "azure"}
    if p.name.endswith(".traj.json") or (p.is_dir() and next(p.rglob("*.traj.json"), None)):
        return "swe-agent"
    if p.is_dir() and next(p.glob("chunk-*-trace.csv"), None):
        return "servegen"
    if p.is_dir():
        return "weka"
    if p.suffix in by_suffix:
        return by_suffix[p.suffix]
    with open(p) as f:
        head = f.read(4096).lstrip()
    if head.startswith("TIMESTAMP,"):
        return "azure"
    first = head.split("\n", 1)[0]
    if first.startswith("{") and '"hash_ids"' in first and '"input_length"' in first:
        return "mooncake"
    if head.startswith("{"):
        return "weka"
    raise TraceError(
        str(path), 1, "format", f"cannot tell the format; allowed: {', '.join(FORMATS)} (--format)"
    )


def load_trace(
    path: str | Path,
    fmt: str = "auto",
    window_s: tuple[float, float] | None = None,
    clients: tuple[int, ...] | None = None,
    seed: int = 0,
) -> Trace:
    """Load `path` as `fmt` (auto: detected); errors are one-line `TraceError`s. ServeGen samples its
    `clients` in `window_s` with `seed` (the other formats are cut to a window when replayed)."""
    if not Path(path).exists():
        raise TraceError(str(path), None, "trace", "no such file or directory")
    if fmt == "auto":
        return _load(path, detect_format(path), window_s, clients, seed)
    try:
        return _load(path, fmt, window_s, clients, seed)
    except TraceError as e:
        e.args = (f"{e}; {_looks_like(path, fmt)}",)
        raise


def _looks_like(path: str | Path, fmt: str) -> str:
    """Why a trace given as `fmt` may have failed: what its name and first line say it is instead."""
    try:
        detected = detect_format(path)
    except (TraceError, OSError, UnicodeDecodeError):
        return f"read as {fmt} (--format)"
    if detected == fmt:
        return f"read as {fmt} (--format)"
    return f"read as {fmt}, but it looks like a {detected} trace: try --format {detected} (or auto)"


def _load(
    path: str | Path,
    fmt: str,
    window_s: tuple[float, float] | None,
    clients: tuple[int, ...] | None,
    seed: int,
) -> Trace:
    if fmt == "mooncake":
        return load_mooncake(path)
    if fmt == "azure":
        return load_azure(path)
    if fmt == "weka":
        return load_weka(path)
    if fmt == "swe-agent":
        return load_swe_agent(path)
    if fmt == "servegen":
        return load_servegen(path, window_s, clients, seed)
    raise TraceError(str(path), None, "format", f"{fmt!r}: unknown; allowed: {', '.join(FORMATS)}")
