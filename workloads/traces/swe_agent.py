"""mini-SWE-agent trajectories (full text): one session per `*.traj.json`, one turn per assistant message.

    {"messages": [{"role": "system", ...}, {"role": "user", ...},
                  {"role": "assistant", "content": "...", "extra": {"response": {"created": 1763509284,
                   "usage": {"prompt_tokens": 1460, "completion_tokens": 246,
                             "completion_tokens_details": {"reasoning_tokens": 192}}}}}, ...]}

A turn's prompt is every message before its assistant message (`ChatPrompt`), rendered by the render
tier's template when sent, so the prompt tokens come from the real text; its output is the call's
completion plus reasoning tokens (the answer's first tokens are the assistant text the next prompt
repeats). `created` (Unix seconds, 1 s resolution) gives each turn's trace time; the gap to the next
call holds the model's latency and the tool's run, which the trace does not split, so `think_s` is 0
and `api_s` is the whole gap (`--timing original` or `api-scaled` replays the original pacing).
Sessions keep their wall-clock alignment: the excerpt's 16 ran concurrently.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from workloads.traces.fields import Row
from workloads.traces.session import ChatPrompt, Session, Trace, TraceError, Turn


def _session(path: Path) -> tuple[Session, float]:
    """The file's session with turn times in Unix seconds (shifted later), and its first call's time."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TraceError(str(path), e.lineno, "file", f"not JSON ({e.msg})") from None
    top = Row(data, str(path), None)
    messages = top.optional("messages")
    if not isinstance(messages, list) or not messages:
        raise top.error("messages", "expected a non-empty list of chat messages")
    turns: list[Turn] = []
    for i, msg in enumerate(messages):
        row = Row(msg, str(path), None, f"messages[{i}].")
        if row.optional("role") not in ("system", "user", "assistant", "tool"):
            raise row.error("role", f"{row.optional('role')!r}: expected system, user, assistant or tool")
        if not isinstance(row.optional("content"), str):
            raise row.error("content", "expected a string")
        if row.optional("role") != "assistant":
            continue
        response = Row(
            (row.optional("extra") or {}).get("response"), str(path), None, f"{row.prefix}extra.response."
        )
        usage = Row(response.optional("usage"), str(path), None, f"{response.prefix}usage.")
        details = usage.optional("completion_tokens_details") or {}
        reasoning = details.get("reasoning_tokens") or 0
        prompt = ChatPrompt(
            tuple({"role": m["role"], "content": m["content"]} for m in messages[:i]),
            usage.integer("prompt_tokens", 1),
        )
        turns.append(
            Turn(
                prompt,
                max(1, usage.integer("completion_tokens") + int(reasoning)),
                response.number("created"),
            )
        )
    if not turns:
        raise top.error("messages", "no assistant message: nothing was asked of the model")
    for prev, turn in itertools.pairwise(turns):
        prev.api_s = turn.t_s - prev.t_s
    session_id = str(top.optional("instance_id") or path.name.removesuffix(".traj.json"))
    return Session(session_id, turns), turns[0].t_s


def load_swe_agent(path: str | Path) -> Trace:
    """A `*.traj.json` file or a directory of them (searched recursively); times from the first call."""
    p = Path(path)
    files = sorted(p.rglob("*.traj.json")) if p.is_dir() else [p]
    if not files:
        raise TraceError(str(path), None, "files", "no *.traj.json trajectory here")
    sessions = [_session(f) for f in files]
    start = min(first for _, first in sessions)
    for session, _ in sessions:
        for turn in session.turns:
            turn.t_s -= start
    return Trace(p.name, [s for s, _ in sessions])
