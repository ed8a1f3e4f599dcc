"""WEKA agentic traces (real Claude Code sessions, kv-cache-tester's format): one session per file.

    {"id": "trace_0026", "block_size": 64, "hash_id_scope": "local", "requests": [
        {"t": 0.0, "in": 15291, "out": 2282, "hash_ids": [1, ..., 238], "api_time": 46.25, "think_time": 0.0},
        {"t": 100.65, "type": "subagent", "agent_id": "agent_001", "requests": [...]}, ...]}

`t` seconds from the session's first request, `in` / `out` tokens, `hash_ids` one per *full* 64-token
block of the input (the trailing partial block is not hashed: it gets an ID of its own, linked to the
next turn's block where that turn continues the prompt), `think_time` the client's delay before the
request (tool execution, the user), `api_time` the original call's duration. A `subagent` entry spawns a
session of its own (its `t` restarts at 0) after the request before it; the parent's next request
waits for every sub-agent spawned since its last one. `hash_id_scope: local` scopes IDs to the file
(sub-agents share the parent's), so two files never share a block by accident.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workloads.traces.fields import Row
from workloads.traces.linking import link_partial_blocks
from workloads.traces.session import HashPrompt, Session, Trace, TraceError, Turn


class _Reader:
    def __init__(self, path: str, block_size: int, namespace: str) -> None:
        self.path = path
        self.block_size = block_size
        self.namespace = namespace
        self.num_tails = 0

    def session(
        self, session_id: str, rows: Any, prefix: str, offset_s: float, parent: str | None
    ) -> Session:
        if not isinstance(rows, list) or not rows:
            raise TraceError(self.path, None, prefix + "requests", "expected a non-empty list of requests")
        session = Session(session_id, [], parent)
        spawned: list[Session] = []
        last_t = 0.0
        for i, data in enumerate(rows):
            row = Row(data, self.path, None, f"{prefix}requests[{i}].")
            t_s = row.number("t")
            if t_s < last_t:
                raise row.error("t", f"{t_s:g}: earlier than the request before (unsorted)")
            last_t = t_s
            if row.optional("type") == "subagent":
                if not session.turns:
                    raise row.error("type", "a sub-agent before the session's first request")
                sub_id = f"{session_id}/{row.optional('agent_id') or f'subagent_{i}'}"
                sub = self.session(sub_id, row.optional("requests"), row.prefix, offset_s + t_s, session_id)
                session.turns[-1].subagents.append(sub)
                spawned.append(sub)
                continue
            session.turns.append(self._turn(row, offset_s + t_s))
        link_partial_blocks(session, self.block_size)
        return session

    def _turn(self, row: Row, t_s: float) -> Turn:
        num_tokens = row.integer("in", 1)
        hash_ids = row.int_list("hash_ids")
        if len(hash_ids) != num_tokens // self.block_size:
            raise row.error(
                "hash_ids",
                f"{len(hash_ids)} IDs: expected in // block_size = {num_tokens // self.block_size}",
            )
        if num_tokens % self.block_size:
            self.num_tails += 1
            hash_ids = [*hash_ids, -self.num_tails]  # the partial block's own ID (negative: never a trace ID)
        api = row.optional("api_time")
        return Turn(
            HashPrompt(tuple(hash_ids), num_tokens, self.namespace),
            row.integer("out", 1),
            t_s,
            think_s=row.number("think_time", default=0.0),
            api_s=row.number("api_time") if api is not None else None,
        )


def load_weka_file(path: str | Path) -> Trace:
    path = str(path)
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise TraceError(path, e.lineno, "file", f"not JSON ({e.msg})") from None
    top = Row(data, path, None)
    block_size = top.integer("block_size", 1)
    scope = top.optional("hash_id_scope") or "local"
    if scope not in ("local", "global"):
        raise top.error("hash_id_scope", f"{scope!r}: expected 'local' or 'global'")
    trace_id = str(top.optional("id") or Path(path).stem)
    reader = _Reader(path, block_size, f"weka/{trace_id}" if scope == "local" else "weka")
    session = reader.session(trace_id, top.optional("requests"), "", 0.0, None)
    return Trace(trace_id, [session], block_size)


def load_weka(path: str | Path) -> Trace:
    """One file, or a directory of `*.json` files: one session each, all starting at time 0."""
    p = Path(path)
    if not p.is_dir():
        return load_weka_file(p)
    files = sorted(p.glob("*.json"))
    if not files:
        raise TraceError(str(path), None, "files", "no *.json trace in this directory" + _what_is_there(p))
    traces = [load_weka_file(f) for f in files]
    sizes = {t.block_size or 0 for t in traces}
    if len(sizes) > 1:
        raise TraceError(
            str(path), None, "block_size", f"{sorted(sizes)}: the files disagree (one size per replay)"
        )
    return Trace(p.name, [s for t in traces for s in t.sessions], traces[0].block_size)


def _what_is_there(directory: Path) -> str:
    """What a directory without WEKA sessions holds instead, and the loader that reads it."""
    found = sorted(f for f in directory.iterdir() if f.is_file())
    if not found:
        return " (it is empty)"
    readers = {".csv": "azure", ".jsonl": "mooncake"}
    first = next((f for f in found if f.suffix in readers), found[0])
    reader = readers.get(first.suffix)
    hint = f": --trace {first} --format {reader} reads one" if reader else ""
    return f" (it holds {len(found)} file(s), e.g. {first.name}{hint})"
