"""Replaying against any OpenAI-compatible server (`testbed replay --target URL`): a running `testbed
serve`, or a real vLLM.

Each request goes out streaming: a chat completion with the trace's messages for a full-text trace
(the server renders them), a completion with the prompt's token IDs for a hash-ID trace (as vLLM
accepts). `ignore_eos` asks for exactly `max_tokens` (vLLM's extension; servers that do not know it
ignore it). The client stamps every streamed chunk on its own clock: TTFT and ITL as the client sees
them, in the same results table a testbed run writes (wall seconds; the server's `id` kept to match
the server's own records).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx

from messages import ClientRequest, FinishedReason, RequestResult


class OpenAITarget:
    def __init__(
        self, base_url: str, model: str, now: Callable[[], float], api_key: str | None = None
    ) -> None:
        """`now`: the replay's clock (wall seconds from its start), which stamps every chunk."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=httpx.Timeout(600.0)
        )
        self.model = model
        self.now = now

    async def close(self) -> None:
        await self.client.aclose()

    async def submit(self, creq: ClientRequest) -> RequestResult:
        """Send `creq` and stream its answer; failures are recorded in the result, never raised."""
        result = RequestResult.for_request(creq)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": creq.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        if creq.session_id is not None:  # as vLLM's multi-turn benchmark sends it (--send-conversation-id)
            body["conversation_id"] = creq.session_id
        if creq.render is not None:
            path, body["messages"] = "/v1/chat/completions", creq.render.messages
            if creq.render.tools:
                body["tools"] = creq.render.tools
            if creq.render.template_kwargs:
                body["chat_template_kwargs"] = creq.render.template_kwargs
        else:
            path, body["prompt"] = "/v1/completions", list(creq.prompt_token_ids)  # JSON: a list
        try:
            async with self.client.stream("POST", path, json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    _failed(result, resp.status_code, f"HTTP {resp.status_code}: {text[:300]}")
                    return result
                async for line in resp.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        self._chunk(json.loads(line[6:]), result)
        except (httpx.HTTPError, json.JSONDecodeError) as e:
            result.finished_reason, result.error = "error", f"{type(e).__name__}: {e}"
        if result.finished_reason is None:
            result.finished_reason, result.error = "error", "the stream ended without a finish_reason"
        return result

    def _chunk(self, chunk: dict[str, Any], result: RequestResult) -> None:
        """One SSE chunk: a token (stamped now), a finish reason, or the usage. The first chunk with a
        choice is the first token, even without text (vLLM sends the role chunk with the first token,
        and `vllm bench serve` stamps TTFT there); later ones count where they carry text."""
        if isinstance(
            error := chunk.get("error"), dict
        ):  # an error event (vLLM: a refusal after its stream began)
            _failed(result, int(error.get("code") or 500), f"error event: {json.dumps(error)[:300]}")
            return
        server = result.server
        server.server_request_id = chunk.get("id", server.server_request_id)
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text = delta.get("content") or _reasoning(delta) or delta.get("tool_calls") or choice.get("text")
            if text or not result.token_times_s:
                result.token_times_s.append(self.now())
            if delta:
                _add_delta(result, delta)
            if reason := choice.get("finish_reason"):
                _finish(result, reason)
        usage = chunk.get("usage")
        if usage:  # the server's counts: a chunk may carry several tokens, and only it knows its cache
            result.num_prompt_tokens = int(usage.get("prompt_tokens") or result.num_prompt_tokens)
            if usage.get("completion_tokens") is not None:
                server.server_num_output_tokens = int(usage["completion_tokens"])
            details = usage.get("prompt_tokens_details") or {}  # vLLM: --enable-prompt-tokens-details
            if details.get("cached_tokens") is not None:
                server.server_num_cached_tokens = int(details["cached_tokens"])


def _add_delta(result: RequestResult, delta: dict[str, Any]) -> None:
    """Grow `result.server.answer_message` by a streamed chat delta (tool calls arrive as pieces by
    index: the first with id and name, later ones with more of the arguments)."""
    server = result.server
    msg = server.answer_message = server.answer_message or {"role": "assistant", "content": ""}
    msg["content"] += delta.get("content") or ""
    if reasoning := _reasoning(delta):  # kept as chat templates read it back
        msg["reasoning_content"] = msg.get("reasoning_content", "") + reasoning
    for piece in delta.get("tool_calls") or []:
        calls = msg.setdefault("tool_calls", [])
        index = piece.get("index", len(calls))
        while len(calls) <= index:
            calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        fn, got = calls[index]["function"], piece.get("function") or {}
        calls[index]["id"] = piece.get("id") or calls[index]["id"]
        fn["name"] += got.get("name") or ""
        fn["arguments"] += got.get("arguments") or ""


FINISH_REASONS: dict[str, FinishedReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "stop",  # the engine stopped; the API names the stop a call (vLLM: STOP -> "tool_calls")
    "abort": "abort",
    "error": "error",
}
"""A server's `finish_reason` as the engine's reason it reports (OpenAI's and vLLM's names)."""


def _failed(result: RequestResult, status: int, error: str) -> None:
    """The server answered `status` instead of tokens: its overload answers (vLLM's queue limits: 503; a
    gateway's: 429) refused the request, any other failed it."""
    result.finished_reason = "rejected" if status in (429, 503) else "error"
    result.error = error


def _finish(result: RequestResult, reason: str) -> None:
    """The request ended as the server says; a reason no server of vLLM's kind gives is an error."""
    result.finished_reason = FINISH_REASONS.get(reason, "error")
    if reason not in FINISH_REASONS:
        result.error = f"finish_reason {reason!r}: not one of {sorted(FINISH_REASONS)}"


def _reasoning(delta: dict[str, Any]) -> str | None:
    """A chat delta's reasoning text: `reasoning` as vLLM 0.32 (and `testbed serve`) streams it, or
    `reasoning_content` (older vLLM)."""
    return delta.get("reasoning") or delta.get("reasoning_content")
