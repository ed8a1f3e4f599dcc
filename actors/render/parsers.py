"""Output parsers: `<think>` reasoning and Hermes-style `<tool_call>{json}</tool_call>` tool calls.

Two parsers with one interface (`feed(delta_text) -> ParsedDelta`, `finish() -> ParsedDelta`):

- `IncrementalParser` keeps a small state machine and looks only at new text: O(delta) per call.
- `RescanningParser` re-parses the whole text so far on every call and emits what changed, as vLLM's
  streaming reasoning and tool parsers do (they are handed `previous_text` and `current_text`):
  O(text) per call, O(n²) per stream.

Both produce the same deltas for the same text (a test checks it). A model may emit the tags as
special tokens or spell them out in pieces; either way a partial tag at the end of the text is held back
until the next delta shows whether it is one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

THINK_START, THINK_END = "<think>", "</think>"
CALL_START, CALL_END = "<tool_call>", "</tool_call>"


@dataclass
class ToolCall:
    name: str
    arguments: str
    """The arguments as a JSON string (OpenAI's wire form)."""


@dataclass
class ParsedDelta:
    reasoning_content: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning_content or self.content or self.tool_calls)

    def extend(self, other: ParsedDelta) -> None:
        self.reasoning_content += other.reasoning_content
        self.content += other.content
        self.tool_calls += other.tool_calls


def _tool_call(body: str) -> ToolCall | None:
    """`{"name": ..., "arguments": {...}}` -> ToolCall; None if it is not one (then it stays text)."""
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
            else:  # inside a tool call: buffer until its end tag
                end = text.find(CALL_END)
                if end < 0:
                    keep = _partial_tag_len(text, (CALL_END,))
                    self._call += text[: len(text) - keep]
                    self._pending = text[len(text) - keep :]
                    return out
                body, text = self._call + text[:end], text[end + len(CALL_END) :]
                self._call, self._state = "", "content"
                call = _tool_call(body.strip())
                if call is None:
                    out.content += CALL_START + body + CALL_END
                else:
                    out.tool_calls.append(call)
        return out

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
            self._state, self._strip_newlines = "content", True
            return text[i + len(tag) :]
        self._state = "call"
        return text[i + len(tag) :]

    def finish(self) -> ParsedDelta:
        """The stream ended: what was held back is text after all (an unclosed tool call stays text)."""
        out = ParsedDelta()
        held = self._pending
        if self._state == "reasoning":
            out.reasoning_content = held
        elif self._state == "call":
            out.content = CALL_START + self._call + held
        else:
            out.content = held
        self._pending, self._call = "", ""
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
        call = _tool_call(m.group(1).strip())
        if call is None:
            out.content += rest[pos : m.end(1) + len(CALL_END)]
            pos = m.end(1) + len(CALL_END)
        else:
            out.content += rest[pos : m.start()]
            out.tool_calls.append(call)
            pos = m.end()
    tail = rest[pos:]
    if not final:
        start = tail.find(CALL_START)  # an open tool call, or a partial tag: not known yet
        tail = tail[:start] if start >= 0 else tail[: len(tail) - _partial_tag_len(tail, (CALL_START,))]
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
        out = ParsedDelta(
            now.reasoning_content[len(sent.reasoning_content) :],
            now.content[len(sent.content) :],
            now.tool_calls[len(sent.tool_calls) :],
        )
        self._sent = now
        return out
