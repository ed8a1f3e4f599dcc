"""A replayable trace: sessions of turns, as every loader produces them.

A session is one user (or agent) sending its turns in order; a turn may first spawn sub-agent sessions
and waits for all of them before it is sent (an agent delegating work). A trace without sessions (the
Azure CSV, Mooncake rows without `session_id`) is one single-turn session per request, replayed open
loop at its timestamps.

Prompts stay descriptors until a turn is sent (`Prompt`): a 20-minute Mooncake window is 44M prompt
tokens, too many to hold as Python lists at once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


class TraceError(ValueError):
    """A trace file that cannot be replayed: one line naming the file, line and field."""

    def __init__(self, path: str, line: int | None, key: str, message: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {key}: {message}")


@dataclass(frozen=True)
class HashPrompt:
    """A prompt as a hash-ID trace gives it: one token block per hash ID (`trace_block_size` tokens
    each, from `workloads.traces.tokens`), the last one cut so the prompt has `num_tokens`."""

    hash_ids: tuple[int, ...]
    num_tokens: int
    namespace: str
    """Where the IDs are unique: a file for per-trace (`local`) IDs, the trace family for global ones."""


@dataclass(frozen=True)
class TokenPrompt:
    """A prompt given as token IDs (synthetic generators)."""

    token_ids: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class ChatPrompt:
    """A prompt given as chat messages, rendered by the render tier when sent (full-text traces)."""

    messages: tuple[dict, ...]
    num_tokens: int
    """Prompt tokens as the trace reports them (the rendered count may differ)."""


@dataclass(frozen=True)
class FollowUp:
    """A later turn of a conversation driven by the model's own answers: the session's history so far
    (each earlier prompt, then its answer as the model gave it, edited as `workloads.harness` says)
    followed by these new tokens."""

    token_ids: tuple[int, ...]
    strip_answer_tokens: int = 0
    """Leading tokens of the previous answer the history leaves out (its reasoning)."""
    rewrite_answer_tokens: int = 0
    """Trailing tokens of the previous answer the history replaces (its tool call, re-serialised)."""
    num_history_tokens: int = 0
    """The history's length had the model given the trace's answer (for sizes known before sending)."""

    @property
    def num_tokens(self) -> int:
        return self.num_history_tokens + len(self.token_ids)


Prompt = HashPrompt | TokenPrompt | ChatPrompt | FollowUp


@dataclass
class Turn:
    prompt: Prompt
    max_tokens: int
    """Output tokens (the trace's output length; EOS ignored)."""
    t_s: float
    """Send time in the trace, seconds from the trace's start (open loop and the `original` timing)."""
    think_s: float = 0.0
    """Client-side delay before this turn, after the previous one finished (tool execution, the user)."""
    api_s: float | None = None
    """How long the original call took (the `api-scaled` timing), when the trace says."""
    subagents: list[Session] = field(default_factory=list)
    """Sessions spawned before this turn is sent; it waits until all of them have finished."""
    image_tokens: tuple[int, ...] = ()
    """Visual tokens of each image the prompt carries before its text (sampled multimodal traces)."""


@dataclass
class Session:
    session_id: str
    turns: list[Turn]
    parent: str | None = None
    """The session that spawned this one (a sub-agent), or None."""

    @property
    def start_s(self) -> float:
        return self.turns[0].t_s if self.turns else 0.0


@dataclass
class Trace:
    name: str
    sessions: list[Session]
    block_size: int | None = None
    """Tokens per hash ID (512 Mooncake, 64 WEKA); None where the trace has no hash IDs."""

    def all_sessions(self) -> list[Session]:
        """Every session, sub-agents after their parents (depth first)."""
        out: list[Session] = []

        def visit(s: Session) -> None:
            out.append(s)
            for turn in s.turns:
                for sub in turn.subagents:
                    visit(sub)

        for s in self.sessions:
            visit(s)
        return out

    @property
    def closed_loop(self) -> bool:
        """Whether any session has turns that wait for each other (else: every request at its
        timestamp, open loop)."""
        return any(len(s.turns) > 1 or s.turns[0].subagents for s in self.sessions if s.turns)

    @property
    def num_requests(self) -> int:
        return sum(len(s.turns) for s in self.all_sessions())

    def replayed(self, window_s: tuple[float, float] | None, max_turns: int | None) -> Trace:
        """What a replay sends of this trace: the sessions starting in `window_s`, [start, end) trace
        seconds (None: all), each cut to its first `max_turns` turns, sub-agents' too (None: all). A
        window no session starts in is a `TraceError` naming when they start."""
        sessions = self.sessions
        if window_s is not None:
            start, end = window_s
            sessions = [s for s in sessions if start <= s.start_s < end]
            if not sessions:
                starts = [s.start_s for s in self.sessions]
                span = f"between {min(starts):g} and {max(starts):g} s" if starts else "nowhere: it is empty"
                raise TraceError(
                    self.name,
                    None,
                    "window",
                    f"[{start:g}, {end:g}) s holds no session; its sessions start {span}",
                )
        if max_turns is not None:
            sessions = [_first_turns(s, max_turns) for s in sessions]
        return dataclasses.replace(self, sessions=sessions)


def _first_turns(session: Session, max_turns: int) -> Session:
    """`session` cut to its first `max_turns` turns, and so each of its sub-agents."""
    turns = [
        dataclasses.replace(t, subagents=[_first_turns(s, max_turns) for s in t.subagents])
        if t.subagents
        else t
        for t in session.turns[:max_turns]
    ]
    return dataclasses.replace(session, turns=turns)
