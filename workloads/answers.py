"""Forced answers for chat requests: what the testbed "model" says under the forced output policy.

A request with tools gets reasoning and a call to its first tool (arguments filled from the tool's
JSON schema) and then EOS; one without gets reasoning and a text answer filling `max_tokens` exactly
(finish_reason 'length', as `vllm bench serve` measures with ignore_eos). Deterministic for a request:
the words are drawn from a seed and the request's content, so the same request gets the same answer.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

_WORDS = (
    "the request is routed to a prefill engine and its cache moves to decode where every token of the "
    "answer is produced in steps that share the batch with other streams while the scheduler keeps "
    "the budget of tokens per step so that long prompts are split into chunks"
).split()
_SAMPLE = {"string": "Paris", "integer": 3, "number": 21.5, "boolean": True}


def _arguments(tool: dict[str, Any]) -> dict[str, Any]:
    schema = (tool.get("function") or tool).get("parameters") or {}
    props = schema.get("properties") or {}
    wanted = schema.get("required") or list(props)
    return {k: _SAMPLE.get((props.get(k) or {}).get("type", "string"), "x") for k in wanted}


def forced_answer_text(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    seed: int,
    max_tokens: int,
    reasoning: bool = True,
) -> str:
    """The answer's text, before tokenization: reasoning (unless not `reasoning`: a completion, or a chat
    with thinking disabled), then a tool call or about `max_tokens` words (each at least one token)."""
    digest = hashlib.sha256(json.dumps(messages, sort_keys=True, default=str).encode()).digest()
    rng = np.random.default_rng([seed, int.from_bytes(digest[:8], "little")])
    thought = " ".join(rng.choice(_WORDS, 12))
    head = f"<think>\n{thought}\n</think>\n\n" if reasoning else ""
    if tools:
        fn = tools[0].get("function") or tools[0]
        call = json.dumps({"name": fn["name"], "arguments": _arguments(tools[0])})
        return f"{head}<tool_call>\n{call}\n</tool_call>"
    return head + " ".join(rng.choice(_WORDS, max_tokens))


def forced_answer_ids(
    text: str, encode: Any, max_tokens: int, eos_token_id: int, has_tools: bool
) -> list[int]:
    """Token IDs of the answer: a tool call ends with EOS (cut at max_tokens); words fill max_tokens."""
    ids = list(encode(text))
    if has_tools:
        ids.append(eos_token_id)
    else:
        while len(ids) < max_tokens:  # a longer answer than the words give: say it again
            ids += ids
    return ids[:max_tokens]
