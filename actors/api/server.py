"""The HTTP app (FastAPI): OpenAI's chat and completions APIs (SSE streaming or not), models, health and
metrics on one port, plus the render tier's `/render`, `/derender` and the token-ID `/inference/v1/generate`.

Errors are OpenAI's shape with the right status: 400 bad input (validation, malformed JSON, token IDs,
max_tokens), 401 a missing or wrong API key, 404 an unknown model, 413 a body over the limit, 500 a
request that failed inside. A client that goes away mid-stream cancels its request in every role.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from actors.api.frontend import Completion, Frontend
from actors.api.protocol import (
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    DerenderRequest,
    GenerateRequest,
    RenderRequest,
    error_body,
)
from actors.render.parsers import ParsedDelta, ToolCall

T = TypeVar("T")


def _tool_calls(calls: list[ToolCall], stream: bool = False) -> list[dict[str, Any]]:
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


def _usage(num_prompt: int, num_output: int) -> dict[str, int]:
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_output,
        "total_tokens": num_prompt + num_output,
    }


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def build_app(
    frontend: Frontend,
    metrics_text: Callable[[], Awaitable[str]],
    api_key: str | None = None,
    max_body_bytes: int = 4 * 1024**2,
) -> FastAPI:
    """The app around `frontend`; `metrics_text()` is the exposition `/metrics` serves."""
    app = FastAPI(title="disagg-testbed", docs_url=None, redoc_url=None)
    _guard(app, api_key, max_body_bytes)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(await metrics_text(), media_type=CONTENT_TYPE_LATEST)

    _openai_routes(app, frontend)
    _render_routes(app, frontend)
    return app


def _guard(app: FastAPI, api_key: str | None, max_body_bytes: int) -> None:
    """API key, body size, and every error as an OpenAI error body."""

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        if api_key is not None and request.url.path.startswith(("/v1", "/render", "/derender", "/inference")):
            sent = request.headers.get("authorization", "")
            if not secrets.compare_digest(sent, f"Bearer {api_key}"):
                return JSONResponse(
                    error_body(
                        "Incorrect API key provided.", "invalid_request_error", None, "invalid_api_key"
                    ),
                    status_code=401,
                )
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > max_body_bytes:
            await _drain(request, int(size))
            return JSONResponse(
                error_body(
                    f"request body: {int(size)} bytes; allowed: at most {max_body_bytes} bytes",
                    "invalid_request_error",
                    None,
                    "request_too_large",
                ),
                status_code=413,
            )
        return await call_next(request)  # type: ignore[no-any-return]

    @app.exception_handler(ApiError)
    async def api_error(_: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        got = first.get("input")
        got_text = (
            "" if first.get("type") == "json_invalid" else f" (got {json.dumps(got, default=str)[:100]})"
        )
        message = f"{loc or 'body'}: {first.get('msg', 'invalid request')}{got_text}"
        return JSONResponse(error_body(message, "invalid_request_error", loc or None), status_code=400)


MAX_DRAIN_BYTES = 256 * 1024**2
"""The most of a refused body read (and dropped) before answering: beyond it the connection closes."""


async def _drain(request: Request, size: int) -> None:
    """Read a refused body to its end (chunk by chunk, kept nowhere) before the 413: a client still
    writing when the server answers and closes sees the connection reset, not the answer (Python's
    urllib does; curl, `requests` and httpx read the answer early). Not when the client waits for
    `100 Continue` (it sends nothing unless asked), nor past `MAX_DRAIN_BYTES`."""
    if request.headers.get("expect", "").lower() == "100-continue" or size > MAX_DRAIN_BYTES:
        return
    async for _ in request.stream():
        pass


async def _unless_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """`work` (a whole response, or a stream's first chunk), cancelled if the client hangs up first,
    as vLLM's `with_cancellation` does: its request is aborted everywhere rather than run on for
    nobody (a client that gave up on a long answer would otherwise keep its engines busy to the end)."""
    task = asyncio.ensure_future(work)
    left = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, left}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        left.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():  # nobody reads the answer (499: nginx's "client closed request")
        raise ApiError(499, "the client closed the connection", code="client_closed_request")
    return task.result()


async def _disconnected(request: Request) -> None:
    """Until the client hangs up (its body was read: what is left to receive is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _openai_routes(app: FastAPI, frontend: Frontend) -> None:
    """/v1/models, /v1/chat/completions, /v1/completions."""
    model = frontend.model_name

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model, "object": "model", "created": frontend.created(), "owned_by": "disagg-testbed"}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(req: ChatCompletionRequest, request: Request) -> Any:
        frontend.check_model(req.model)
        creq, replica = await frontend.chat_request_for(req)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return await _stream(request, _chat_chunks(frontend, creq, replica, include_usage, model))
        return _chat_completion(
            frontend, await _unless_client_leaves(request, frontend.complete(creq, replica))
        )

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest, request: Request) -> Any:
        frontend.check_model(req.model)
        creq, replica = await frontend.completion_request_for(req)
        echo = await frontend.renders[replica].detokenize(creq.prompt_token_ids) if req.echo else ""
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return await _stream(
                request, _completion_chunks(frontend, creq, replica, include_usage, model, echo)
            )
        done: Completion = await _unless_client_leaves(request, frontend.complete(creq, replica, parse=False))
        text = echo + done.parsed.content
        return {
            "id": done.request_id,
            "object": "text_completion",
            "created": frontend.created(),
            "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": done.finished_reason, "logprobs": None}],
            "usage": _usage(len(done.prompt_token_ids), len(done.output_token_ids)),
        }


def _chat_completion(frontend: Frontend, done: Completion) -> dict[str, Any]:
    """The body of a chat completion answered whole."""
    parsed = done.parsed
    message: dict[str, Any] = {
        "role": "assistant",
        "content": parsed.content if parsed.content.strip() or not parsed.tool_calls else None,
        "reasoning_content": parsed.reasoning_content or None,
        "tool_calls": _tool_calls(parsed.tool_calls),
    }
    choice = {
        "index": 0,
        "message": message,
        "finish_reason": frontend.openai_finish_reason(done.finished_reason, parsed),
    }
    return {
        "id": done.request_id,
        "object": "chat.completion",
        "created": frontend.created(),
        "model": frontend.model_name,
        "choices": [choice],
        "usage": _usage(len(done.prompt_token_ids), len(done.output_token_ids)),
    }


def _render_routes(app: FastAPI, frontend: Frontend) -> None:
    """The render tier's /render and /derender, and the token-ID engine API /inference/v1/generate."""

    @app.post("/render")
    async def render(req: RenderRequest) -> dict[str, Any]:
        frontend.check_model(req.model)
        ids = (await frontend.render(frontend.render_spec(req))).token_ids
        return {"prompt_token_ids": ids, "num_tokens": len(ids)}

    @app.post("/derender")
    async def derender(req: DerenderRequest) -> dict[str, Any]:
        ids = frontend.requests.check_token_ids(req.token_ids, "token_ids")
        replica = frontend.renders[0]
        parsed = ParsedDelta()
        for delta in await replica.derender_stateless(ids, 0, finished=True):
            parsed.extend(delta)
        return {
            "text": await replica.detokenize(ids),
            "reasoning_content": parsed.reasoning_content or None,
            "content": parsed.content,
            "tool_calls": _tool_calls(parsed.tool_calls),
        }

    @app.post("/inference/v1/generate", response_model=None)
    async def generate(req: GenerateRequest, request: Request) -> Any:
        creq = frontend.generate_request(req)
        if req.stream:
            return await _stream(request, _generate_chunks(frontend, creq))
        done = await _unless_client_leaves(request, frontend.complete(creq, None))
        return {
            "request_id": done.request_id,
            "token_ids": done.output_token_ids,
            "finish_reason": done.finished_reason,
            "usage": _usage(len(done.prompt_token_ids), len(done.output_token_ids)),
        }


async def _stream(request: Request, chunks: AsyncGenerator[str, None]) -> StreamingResponse:
    """An SSE response whose first chunk was awaited before it starts: a request refused before its
    first token (a 429 at admission, a 500) gets that status, not a 200 and an error event."""
    try:
        first = await _unless_client_leaves(request, anext(chunks, None))
    except BaseException:
        await chunks.aclose()
        raise
    return StreamingResponse(
        _guarded(_prepend(first, chunks)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache"},
    )


async def _prepend(first: str | None, chunks: AsyncGenerator[str, None]) -> AsyncGenerator[str, None]:
    if first is not None:
        yield first
    async with aclosing(chunks):
        async for chunk in chunks:
            yield chunk


async def _guarded(chunks: AsyncGenerator[str, None]) -> AsyncIterator[str]:
    """SSE framing: a failure after the stream started is an error event (the status line is already
    sent), then `[DONE]`. A client that leaves closes `chunks` at once, which aborts its request."""
    async with aclosing(chunks):
        try:
            async for chunk in chunks:
                yield chunk
        except ApiError as e:
            yield _sse(e.body())
    yield "data: [DONE]\n\n"


async def _chat_chunks(
    frontend: Frontend, creq: Any, replica: int, include_usage: bool, model: str
) -> AsyncGenerator[str, None]:
    base = {
        "id": creq.request_id,
        "object": "chat.completion.chunk",
        "created": frontend.created(),
        "model": model,
    }
    role: dict[str, Any] | None = {
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "finish_reason": None,
    }
    num_out, seen = 0, ParsedDelta()
    async with aclosing(frontend.events(creq, replica)) as events:
        async for ev in events:
            if role is not None:  # as vLLM: the role chunk leaves with the first token, not before it
                yield _sse({**base, "choices": [role]})
                role = None
            num_out += len(ev.token_ids)
            seen.extend(ev.delta)
            delta: dict[str, Any] = {}
            if ev.delta.reasoning_content:
                delta["reasoning_content"] = ev.delta.reasoning_content
            if ev.delta.content:
                delta["content"] = ev.delta.content
            if ev.delta.tool_calls:
                delta["tool_calls"] = _tool_calls(ev.delta.tool_calls, stream=True)
            reason = frontend.openai_finish_reason(ev.finished_reason, seen) if ev.finished_reason else None
            if delta or reason:
                yield _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]})
    if include_usage:
        yield _sse({**base, "choices": [], "usage": _usage(len(creq.prompt_token_ids), num_out)})


async def _completion_chunks(
    frontend: Frontend, creq: Any, replica: int, include_usage: bool, model: str, echo: str
) -> AsyncGenerator[str, None]:
    base = {"id": creq.request_id, "object": "text_completion", "created": frontend.created(), "model": model}
    if echo:
        yield _sse({**base, "choices": [{"index": 0, "text": echo, "finish_reason": None, "logprobs": None}]})
    num_out = 0
    async with aclosing(frontend.events(creq, replica, parse=False)) as events:
        async for ev in events:
            num_out += len(ev.token_ids)
            if ev.delta.content or ev.finished_reason:
                choice = {
                    "index": 0,
                    "text": ev.delta.content,
                    "finish_reason": ev.finished_reason,
                    "logprobs": None,
                }
                yield _sse({**base, "choices": [choice]})
    if include_usage:
        yield _sse({**base, "choices": [], "usage": _usage(len(creq.prompt_token_ids), num_out)})


async def _generate_chunks(frontend: Frontend, creq: Any) -> AsyncGenerator[str, None]:
    async with aclosing(frontend.events(creq, None)) as events:
        async for ev in events:
            yield _sse(
                {
                    "request_id": creq.request_id,
                    "token_ids": ev.token_ids,
                    "finish_reason": ev.finished_reason,
                }
            )
