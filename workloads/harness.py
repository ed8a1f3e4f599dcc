"""The client side of a conversation: what each turn sends, rebuilt from the answers the model gave,
with the edits chat templates and agent harnesses make on the way back.

Those edits are why a new prompt need not be a prefix of what decode generated (vLLM issue #43094)::

    decode holds     [prompt k][<think>reasoning</think> answer  <tool_call>{"a": 1}</tool_call>]
    template strips  [prompt k][                     answer  <tool_call>{"a": 1}</tool_call>][new]
    harness rewrites [prompt k][<think>reasoning</think> answer  <tool_call>{"a":1}</tool_call>][new]
                                ^ first difference: KV after it belongs to other tokens

Token traces (`FollowUp` turns) edit token IDs: the answer's first `strip_answer_tokens` left out, its
last `rewrite_answer_tokens` replaced. Chat traces (`replay.history=model`) send the server's answer
message in place of the trace's; the server's template strips past reasoning itself, and
`replay.harness_edit` re-serialises tool calls.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from emulation.config import ReplayConfig
from messages import RequestResult
from messages.token_ids import PromptIds
from workloads.traces.session import ChatPrompt, FollowUp, Prompt


def answer_in_history(answer: list[int], follow_up: FollowUp, vocab_size: int) -> list[int]:
    """`answer` as the next prompt repeats it: its first `strip_answer_tokens` dropped, its last
    `rewrite_answer_tokens` shifted to other IDs (deterministic; the count stays)."""
    kept = answer[follow_up.strip_answer_tokens :]
    n = min(follow_up.rewrite_answer_tokens, len(kept))
    return kept[: len(kept) - n] + [(t + 1) % vocab_size for t in kept[len(kept) - n :]]


def reserialized(message: dict[str, Any]) -> dict[str, Any]:
    """`message` with every tool call's arguments dumped compact, as a harness that keeps calls as
    objects sends them back (arguments that are not JSON are left as they are)."""
    calls = []
    for call in message.get("tool_calls") or []:
        fn = dict(call.get("function") or {})
        with contextlib.suppress(TypeError, ValueError):
            fn["arguments"] = json.dumps(json.loads(fn.get("arguments") or "{}"), separators=(",", ":"))
        calls.append({**call, "function": fn})
    return {**message, "tool_calls": calls} if calls else message


class Harness:
    """One session's client: each turn's prompt from what the model answered before."""

    def __init__(self, cfg: ReplayConfig, vocab_size: int) -> None:
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.token_ids: list[int] = []
        """The previous prompt, then its answer as the next turn repeats it (`FollowUp` turns)."""
        self._trace_messages: tuple[dict[str, Any], ...] = ()
        """The previous chat turn's messages as the trace has them, and as they were sent."""
        self._sent_messages: list[dict[str, Any]] = []
        self._answer: dict[str, Any] | None = None
        """The server's answer to the previous chat turn (history=model)."""

    def follow_up_ids(self, prompt: FollowUp) -> list[int]:
        return self.token_ids + list(prompt.token_ids)

    def messages(self, prompt: ChatPrompt) -> list[dict[str, Any]]:
        """The turn's messages: the trace's, or (history=model) the conversation so far, the server's
        answer in place of the trace's, then what the trace adds after it. Where the trace's history
        does not continue the previous turn's (an agent that compacted it), the trace's own."""
        trace, n, answer = prompt.messages, len(self._trace_messages), self._answer
        answered_next = len(trace) > n and trace[n].get("role") == "assistant"
        continues = answered_next and trace[:n] == self._trace_messages
        if self.cfg.history == "model" and answer is not None and continues:
            if self.cfg.harness_edit == "reserialize_tool_calls":
                answer = reserialized(answer)
            sent = [*self._sent_messages, answer, *trace[n + 1 :]]
        else:
            sent = list(trace)
        self._trace_messages = trace
        self._sent_messages = sent
        return sent

    def answered(self, prompt_ids: PromptIds, result: RequestResult, next_prompt: Prompt | None) -> None:
        """Turn done: keep what the next turn (`next_prompt`, None after the last) repeats."""
        self.token_ids = []  # only a follow-up reads it: the trace's own prompts stand alone
        if isinstance(next_prompt, FollowUp):
            answer = answer_in_history(result.output_token_ids, next_prompt, self.vocab_size)
            self.token_ids = prompt_ids + answer
        self._answer = result.server.answer_message
