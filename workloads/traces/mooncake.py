"""Mooncake JSONL (FAST'25 traces): one request per line.

    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, ..., 13]}

`timestamp` ms from the trace's start (sorted), `input_length` / `output_length` tokens, `hash_ids` one per
512-token block, global across the file (a shared ID is a shared prefix block). Optional, as other
replayers accept them: `session_id` (rows with one ID are one session's turns, in file order) and
`delay` (ms after the session's previous turn finished; not on a first turn). Without any
`session_id` the trace replays open loop at its timestamps. As Dynamo's reader does, `input_length` is
clamped to what the hash IDs cover.
"""

from __future__ import annotations

import json
from pathlib import Path

from workloads.traces.fields import Row
from workloads.traces.linking import link_partial_blocks
from workloads.traces.session import HashPrompt, Session, Trace, TraceError, Turn

BLOCK_SIZE = 512


def load_mooncake(path: str | Path, block_size: int = BLOCK_SIZE) -> Trace:
    path = str(path)
    sessions: dict[str, Session] = {}
    last_t = 0.0
    with open(path) as f:
        for line_no, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise TraceError(path, line_no, "row", f"not JSON ({e.msg})") from None
            row = Row(data, path, line_no)
            t_s = row.number("timestamp") / 1000.0
            if t_s < last_t:
                raise row.error("timestamp", f"{t_s * 1000:g} ms: earlier than the line before (unsorted)")
            last_t = t_s
            hash_ids = row.int_list("hash_ids")
            num_tokens = min(row.integer("input_length", 1), len(hash_ids) * block_size)
            if not hash_ids:
                raise row.error("hash_ids", "[]: a prompt needs at least one block")
            sid = row.optional("session_id")
            key = str(sid) if sid is not None else f"request_{line_no}"
            turn = Turn(
                HashPrompt(tuple(hash_ids), num_tokens, "mooncake"), row.integer("output_length", 1), t_s
            )
            session = sessions.get(key)
            if row.optional("delay") is not None:
                if session is None:
                    raise row.error("delay", "given on a session's first turn (allowed on later turns only)")
                turn.think_s = row.number("delay") / 1000.0
            elif session is not None:
                turn.think_s = t_s - session.turns[-1].t_s  # what the trace's timestamps leave between them
            if session is None:
                sessions[key] = Session(key, [turn])
            else:
                session.turns.append(turn)
    if not sessions:
        raise TraceError(path, None, "rows", "the file holds no requests")
    trace = Trace(Path(path).name, list(sessions.values()), block_size)
    for s in trace.sessions:
        link_partial_blocks(s, block_size)
    return trace
