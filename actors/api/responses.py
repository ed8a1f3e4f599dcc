"""Response bodies and stream chunks in the shapes vLLM 0.32's server gives them (the same keys and JSON
types, its nulls included; `tests/test_vllm_api_conformance.py` compares them with a running vLLM).

Where vLLM's shapes differ between endpoints, so do these: a chat answer's usage has
`prompt_tokens_details` {cached_tokens, created_cache_tokens, multimodal_tokens} and
`completion_tokens_details` {reasoning_tokens}; streamed, `multimodal_tokens` is left out; a completion's
has `completion_tokens_details: null` whole and only `cached_tokens` streamed. Reasoning is `reasoning`
(vLLM's name; `reasoning_content` is the older one). The prompt details are always there, as from a vLLM
started with `--enable-prompt-tokens-details`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from actors.api.frontend import Completion, Frontend, PromptCache
from actors.api.streaming import sse
from actors.render.parsers import ParsedDelta, ToolCall
from messages import ClientRequest, RequestResult

SYSTEM_FINGERPRINT = "disagg-testbed"
NULL_RESPONSE_FIELDS = ("prompt_logprobs", "prompt_token_ids", "prompt_text")
"""A whole chat answer's vLLM fields the testbed has no value for (null, as vLLM's by default)."""
NULL_TAIL = ("kv_transfer_params", "ec_transfer_params", "metrics")


def tool_calls(calls: list[ToolCall], stream: bool = False) -> list[dict[str, Any]]:
    """OpenAI's tool_calls: whole calls, or in a stream a call's first piece (id, type, name, the
    arguments so far) and then pieces of its arguments, by index."""
    out = []
    for c in calls:
        call: dict[str, Any] = {"function": {"arguments": c.arguments}}
        if c.name:
            call.update(id=f"call_{uuid.uuid4().hex[:24]}", type="function")
            call["function"]["name"] = c.name
        if stream:
            call["index"] = c.index
        out.append(call)
    return out


def counts(num_prompt: int, num_output: int) -> dict[str, int]:
    return {
        "prompt_tokens": num_prompt,
        "total_tokens": num_prompt + num_output,
        "completion_tokens": num_output,
    }


def chat_usage(
    num_prompt: int, num_output: int, cache: PromptCache, num_reasoning: int, streamed: bool
) -> dict[str, Any]:
    details: dict[str, Any] = {
        "cached_tokens": cache.cached_tokens,
        "created_cache_tokens": cache.created_cache_tokens,
    }
    if not streamed:
        details["multimodal_tokens"] = None
    return {
        **counts(num_prompt, num_output),
        "prompt_tokens_details": details,
        "completion_tokens_details": {"reasoning_tokens": num_reasoning},
    }


def completion_usage(num_prompt: int, num_output: int, cache: PromptCache, streamed: bool) -> dict[str, Any]:
    if streamed:
        return {
            **counts(num_prompt, num_output),
            "prompt_tokens_details": {"cached_tokens": cache.cached_tokens},
        }
    details = {"cached_tokens": cache.cached_tokens, "created_cache_tokens": None, "multimodal_tokens": None}
    return {
        **counts(num_prompt, num_output),
        "prompt_tokens_details": details,
        "completion_tokens_details": None,
    }


def model_card(frontend: Frontend) -> dict[str, Any]:
    """`/v1/models`'s entry for the served model (vLLM's fields; `root` is the target model)."""
    created = frontend.created()
    permission = {
        "id": f"modelperm-{uuid.uuid4().hex[:16]}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    return {
        "id": frontend.model_name,
        "object": "model",
        "created": created,
        "owned_by": "disagg-testbed",
        "root": frontend.cfg.target.model,
        "parent": None,
        "max_model_len": frontend.cfg.scheduler.max_model_len,
        "permission": [permission],
    }


def _whole(
    frontend: Frontend, done: Completion, obj: str, choice: dict[str, Any], usage: Any
) -> dict[str, Any]:
    head = _head(frontend, done.request_id, obj)
    tail = {"service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT, "usage": usage}
    return {**head, "choices": [choice], **tail}


def chat_completion(frontend: Frontend, done: Completion) -> dict[str, Any]:
    """The body of a chat completion answered whole."""
    parsed = done.parsed
    message: dict[str, Any] = {
        "role": "assistant",
        "content": (parsed.content if parsed.content.strip() or not parsed.tool_calls else "") or None,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": parsed.reasoning_content or None,
    }
    if parsed.tool_calls:  # as vLLM's ChatMessage: no key when there are none
        message["tool_calls"] = tool_calls(parsed.tool_calls)
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": frontend.openai_finish_reason(done.finished_reason, parsed),
        "stop_reason": None,
        "token_ids": None,
        "routed_experts": None,
    }
    assert done.cache is not None
    usage = chat_usage(
        len(done.prompt_token_ids), len(done.output_token_ids), done.cache, done.num_reasoning_tokens, False
    )
    body = _whole(frontend, done, "chat.completion", choice, usage)
    return {**body, **dict.fromkeys(NULL_RESPONSE_FIELDS), **dict.fromkeys(NULL_TAIL)}


def text_completion(frontend: Frontend, done: Completion, echo: str) -> dict[str, Any]:
    """The body of a completion answered whole (`echo`: the prompt's text, when asked for)."""
    choice = {
        "index": 0,
        "text": echo + done.parsed.content,
        "logprobs": None,
        "finish_reason": done.finished_reason,
        "stop_reason": None,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
    }
    assert done.cache is not None
    usage = completion_usage(len(done.prompt_token_ids), len(done.output_token_ids), done.cache, False)
    return {**_whole(frontend, done, "text_completion", choice, usage), **dict.fromkeys(NULL_TAIL)}


def _head(frontend: Frontend, request_id: str, obj: str) -> dict[str, Any]:
    """What every body and chunk begins with."""
    return {"id": request_id, "object": obj, "created": frontend.created(), "model": frontend.model_name}


def _chat_choice(delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    """A streamed chat choice: vLLM adds `stop_reason` to the one that finishes."""
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    if finish_reason is not None:
        choice["stop_reason"] = None
    return {**choice, "token_ids": None}


async def chat_chunks(
    frontend: Frontend, creq: ClientRequest, replica: int, include_usage: bool
) -> AsyncGenerator[str, None]:
    """A streamed chat completion's SSE chunks (`[DONE]` is the streaming layer's)."""
    head = _head(frontend, creq.request_id, "chat.completion.chunk")
    role: dict[str, Any] | None = {"index": 0, "delta": {"role": "assistant", "content": ""}}
    num_out, num_reasoning, seen, result = 0, 0, ParsedDelta(), RequestResult.for_request(creq)
    async with aclosing(frontend.events(creq, replica, result=result)) as events:
        async for ev in events:
            if role is not None:  # as vLLM: the role chunk leaves with the first token, not before it
                first = {**role, "logprobs": None, "finish_reason": None}
                yield sse({**head, "choices": [first], "prompt_token_ids": None, "prompt_text": None})
                role = None
            num_out += len(ev.token_ids)
            num_reasoning += bool(ev.delta.reasoning_content)
            seen.extend(ev.delta)
            delta: dict[str, Any] = {}
            if ev.delta.reasoning_content:
                delta["reasoning"] = ev.delta.reasoning_content
            if ev.delta.content:
                delta["content"] = ev.delta.content
            if ev.delta.tool_calls:  # with `content: null` beside them, as vLLM's tool parsers send
                delta = {"content": delta.get("content"), **delta}
                delta["tool_calls"] = tool_calls(ev.delta.tool_calls, stream=True)
            reason = frontend.openai_finish_reason(ev.finished_reason, seen) if ev.finished_reason else None
            if delta or reason:
                yield sse({**head, "choices": [_chat_choice(delta, reason)]})
    if include_usage:
        cache = frontend.prompt_cache(result)
        usage = chat_usage(len(creq.prompt_token_ids), num_out, cache, num_reasoning, True)
        yield sse({**head, "choices": [], "usage": usage, "system_fingerprint": SYSTEM_FINGERPRINT})


async def completion_chunks(
    frontend: Frontend, creq: ClientRequest, replica: int, include_usage: bool, echo: str
) -> AsyncGenerator[str, None]:
    """A streamed completion's SSE chunks (`echo`: the prompt's text first, when asked for)."""
    head = _head(frontend, creq.request_id, "text_completion")

    def chunk(text: str, finish_reason: str | None) -> str:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        return sse({**head, "choices": [{**choice, "prompt_token_ids": None, "token_ids": None}]})

    if echo:
        yield chunk(echo, None)
    num_out, result = 0, RequestResult.for_request(creq)
    async with aclosing(frontend.events(creq, replica, parse=False, result=result)) as events:
        async for ev in events:
            num_out += len(ev.token_ids)
            if ev.delta.content or ev.finished_reason:
                yield chunk(ev.delta.content, ev.finished_reason)
    if include_usage:
        usage = completion_usage(len(creq.prompt_token_ids), num_out, frontend.prompt_cache(result), True)
        yield sse({**head, "choices": [], "usage": usage, "system_fingerprint": SYSTEM_FINGERPRINT})


async def generate_chunks(frontend: Frontend, creq: ClientRequest) -> AsyncGenerator[str, None]:
    """`/inference/v1/generate` streamed: token IDs as they come."""
    async with aclosing(frontend.events(creq, None)) as events:
        async for ev in events:
            yield sse(
                {
                    "request_id": creq.request_id,
                    "token_ids": ev.token_ids,
                    "finish_reason": ev.finished_reason,
                }
            )
