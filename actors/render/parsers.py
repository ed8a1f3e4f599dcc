"""Output parsers: `<think>` reasoning and Hermes-style `<tool_call>{json}</tool_call>` tool calls.

Two parsers with one interface (`feed(delta_text) -> ParsedDelta`, `finish() -> ParsedDelta`):

- `IncrementalParser` keeps a small state machine and looks only at new text: O(delta) per call.
- `RescanningParser` re-parses the whole text so far on every call and emits what changed, as vLLM's
  streaming reasoning and tool parsers do (they are handed `previous_text` and `current_text`):
  O(text) per call, O(n²) per stream.

Both produce the same deltas for the same text (a test checks it). A model may emit the tags as
special tokens or spell them out in pieces; either way a partial tag at the end of the text is held back
until the next delta shows whether it is one.

Tool-call arguments stream as the model writes them (as vLLM's Hermes parser streams them): once a
call's header is complete, each delta carries the next piece of its arguments, and only the brace that
may close the call itself is held back::

    <tool_call>{"name": "get_weather", "arguments": {"city": "Pa   ris"}}</tool_call>
               └──────────── header ─────────────────┘└─ arguments ──┘└ held until the end tag
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field

THINK_START, THINK_END = "<think>", "</think>"
CALL_START, CALL_END = "<tool_call>", "</tool_call>"


@dataclass
class ToolCall:
    name: str
    """In a delta, set on a call's first piece only ("" on the pieces that continue it)."""
    arguments: str
    """The arguments as a JSON string (OpenAI's wire form); in a delta, the next piece of it."""
    index: int = 0
    """Which of the answer's tool calls this is, or continues (OpenAI's streaming `index`)."""


@dataclass
class ParsedDelta:
    reasoning_content: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning_content or self.content or self.tool_calls)

    def extend(self, other: ParsedDelta) -> None:
        """Append `other`, the delta that follows (a piece of a call extends that call's arguments)."""
        self.reasoning_content += other.reasoning_content
        self.content += other.content
        for call in other.tool_calls:
            if call.index < len(self.tool_calls):
                self.tool_calls[call.index].arguments += call.arguments
            else:
                self.tool_calls.append(dataclasses.replace(call))


_CALL_HEADER = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*(?=\{)')
_CALL_TAIL = re.compile(r"\s*\}?\s*$")


def _streamed_call(body: str) -> tuple[str, str] | None:
    """(name, arguments so far) of a call body whose header is complete, else None. The arguments are
    the model's own text, less a trailing brace that may close the call (and the space around it)."""
    m = _CALL_HEADER.match(body)
    if m is None:
        return None
    args = body[m.end() :]
    tail = _CALL_TAIL.search(args)
    assert tail is not None  # the pattern matches at the end of any text
    return json.loads(m.group(1)), args[: tail.start()]


def _tool_call(body: str) -> ToolCall | None:
    """A closed call in another shape (e.g. arguments first, or as a string): `{"name": ..., "arguments":
    ...}` -> ToolCall, sent whole; None if it is not one (then it stays text)."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    return ToolCall(obj["name"], args if isinstance(args, str) else json.dumps(args))


def _partial_tag_len(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags` (all start with
    `<`, so only a `<` near the end can begin one: most calls return after one `find`)."""
    tail = text[1 - max(len(t) for t in tags) :]
    i = tail.find("<")
    while i >= 0:
        if any(t.startswith(tail[i:]) for t in tags):
            return len(tail) - i
        i = tail.find("<", i + 1)
    return 0


class IncrementalParser:
    """State machine over new text only: start -> (reasoning) -> content <-> tool call."""

    def __init__(self) -> None:
        self._state = "start"
        self._pending = ""
        self._call = ""
        self._num_calls = 0
        self._num_args_sent: int | None = None
        """Of the open call's arguments; None until its header is complete."""
        self._strip_newlines = False
        """Just past <think> or </think>: line breaks there are markup, not text."""

    def feed(self, delta: str) -> ParsedDelta:
        out = ParsedDelta()
        text, self._pending = self._pending + delta, ""
        while text:
            if self._strip_newlines:
                text = text.lstrip("\n")
                if not text:
                    break
                self._strip_newlines = False
            if self._state == "start":
                if text.startswith(THINK_START):
                    self._state, text = "reasoning", text[len(THINK_START) :]
                    self._strip_newlines = True
                elif THINK_START.startswith(text):
                    self._pending = text  # could still become <think>
                    return out
                else:
                    self._state = "content"
            elif self._state == "reasoning":
                text = self._until(text, (THINK_END,), out, "reasoning_content")
            elif self._state == "content":
                text = self._until(text, (CALL_START,), out, "content")
            else:  # inside a tool call: stream its arguments, close it at its end tag
                end = text.find(CALL_END)
                if end < 0:
                    keep = _partial_tag_len(text, (CALL_END,))
                    self._call += text[: len(text) - keep]
                    self._pending = text[len(text) - keep :]
                    self._stream_call(out)
                    return out
                self._call += text[:end]
                text = text[end + len(CALL_END) :]
                self._state = "content"
                self._close_call(out, CALL_END)
        return out

    def _stream_call(self, out: ParsedDelta) -> bool:
        """Emit what the open call's arguments gained; False while its header is incomplete."""
        streamed = _streamed_call(self._call)
        if streamed is None:
            return False
        name, args = streamed
        if self._num_args_sent is None:
            out.tool_calls.append(ToolCall(name, args, self._num_calls))
        elif len(args) > self._num_args_sent:
            out.tool_calls.append(ToolCall("", args[self._num_args_sent :], self._num_calls))
        self._num_args_sent = len(args)
        return True

    def _close_call(self, out: ParsedDelta, end_tag: str) -> None:
        """The open call ended (its end tag, or the stream: `end_tag` ""); a call in another shape is
        sent whole, and a body that is no call at all was text."""
        if self._stream_call(out):
            self._num_calls += 1
        else:
            whole = _tool_call(self._call.strip()) if end_tag else None
            if whole is None:
                out.content += CALL_START + self._call + end_tag
            else:
                out.tool_calls.append(dataclasses.replace(whole, index=self._num_calls))
                self._num_calls += 1
        self._call = ""
        self._num_args_sent = None

    def _until(self, text: str, tags: tuple[str, ...], out: ParsedDelta, attr: str) -> str:
        """Emit `text` into `attr` up to the first of `tags` (switching state past it); hold a partial tag."""
        tag = tags[0]
        i = text.find(tag)
        if i < 0:
            keep = _partial_tag_len(text, tags)
            setattr(out, attr, getattr(out, attr) + text[: len(text) - keep])
            self._pending = text[len(text) - keep :]
            return ""
        setattr(out, attr, getattr(out, attr) + text[:i])
        if tag == THINK_END:
            self._state = "content"
            self._strip_newlines = True
            return text[i + len(tag) :]
        self._state = "call"
        return text[i + len(tag) :]

    def finish(self) -> ParsedDelta:
        """The stream ended: what was held back is text after all (an unclosed call whose arguments
        were streaming stays a call, cut short; one whose header never completed stays text)."""
        out = ParsedDelta()
        held = self._pending
        if self._state == "reasoning":
            out.reasoning_content = held
        elif self._state == "call":
            self._call += held
            self._close_call(out, "")
        else:
            out.content = held
        self._pending = ""
        return out


class PlainParser:
    """No parsing: all text is content (the completions API returns the raw text)."""

    def feed(self, delta: str) -> ParsedDelta:
        return ParsedDelta(content=delta)

    def finish(self) -> ParsedDelta:
        return ParsedDelta()


_FULL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def parse_text(text: str, final: bool) -> ParsedDelta:
    """Parse a whole output text at once (what a non-streaming response returns, and what the
    rescanning parser computes on every delta). Unless `final`, a trailing partial tag or an unclosed
    tool call is left out: it is not known yet what it is."""
    out = ParsedDelta()
    rest = text
    if rest.startswith(THINK_START) or (not final and THINK_START.startswith(rest)):
        if not rest.startswith(THINK_START):
            return out
        rest = rest[len(THINK_START) :].lstrip("\n")
        end = rest.find(THINK_END)
        if end < 0:
            keep = 0 if final else _partial_tag_len(rest, (THINK_END,))
            out.reasoning_content = rest[: len(rest) - keep]
            return out
        out.reasoning_content, rest = rest[:end], rest[end + len(THINK_END) :].lstrip("\n")
    pos = 0
    for m in _FULL.finditer(rest):
        streamed = _streamed_call(m.group(1))
        call = ToolCall(*streamed) if streamed else _tool_call(m.group(1).strip())
        if call is None:
            out.content += rest[pos : m.end(1) + len(CALL_END)]
            pos = m.end(1) + len(CALL_END)
        else:
            out.content += rest[pos : m.start()]
            out.tool_calls.append(dataclasses.replace(call, index=len(out.tool_calls)))
            pos = m.end()
    tail = rest[pos:]
    start = tail.find(CALL_START)
    if start >= 0:  # an open call: its arguments so far once its header is complete
        body = tail[start + len(CALL_START) :]
        if not final:
            body = body[: len(body) - _partial_tag_len(body, (CALL_END,))]
        streamed = _streamed_call(body)
        if streamed is not None:
            out.tool_calls.append(ToolCall(*streamed, index=len(out.tool_calls)))
        if streamed is not None or not final:
            tail = tail[:start]
    elif not final:  # a partial tag: not known yet
        tail = tail[: len(tail) - _partial_tag_len(tail, (CALL_START,))]
    out.content += tail
    return out


class RescanningParser:
    """Re-parses all text so far on every delta and emits the difference (vLLM's streaming parsers)."""

    def __init__(self) -> None:
        self._text = ""
        self._sent = ParsedDelta()

    def feed(self, delta: str) -> ParsedDelta:
        self._text += delta
        return self._diff(parse_text(self._text, final=False))

    def finish(self) -> ParsedDelta:
        return self._diff(parse_text(self._text, final=True))

    def _diff(self, now: ParsedDelta) -> ParsedDelta:
        sent = self._sent
        pieces = [  # of calls already begun (only the last one can still grow)
            ToolCall("", after.arguments[len(before.arguments) :], after.index)
            for before, after in zip(sent.tool_calls, now.tool_calls, strict=False)
            if len(after.arguments) > len(before.arguments)
        ]
        begun = [dataclasses.replace(c) for c in now.tool_calls[len(sent.tool_calls) :]]
        out = ParsedDelta(
            now.reasoning_content[len(sent.reasoning_content) :],
            now.content[len(sent.content) :],
            pieces + begun,
        )
        self._sent = now
        return out
