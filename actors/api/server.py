"""The HTTP app (FastAPI): OpenAI's chat and completions APIs (SSE streaming or not), models, health and
metrics on one port, plus the render tier's `/render`, `/derender` and the token-ID `/inference/v1/generate`.

Bodies, chunks and errors have vLLM 0.32's shapes (`responses.py`, `errors.py`): 400 bad input
(validation, malformed JSON, token IDs, max_tokens), 401 a missing or wrong API key, 404 an unknown model,
413 a body over the limit, 503 past vLLM's queue limits (`scheduler.max_num_queued_reqs`, `_tokens`), 429
past a gateway's (`scheduler.max_waiting`, `max_queue_time_s`), 500 a request that failed inside. HTTP
metrics are vLLM's (`instrumentation.py`). A client that goes away mid-stream cancels its request in
every role.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from actors.api import responses
from actors.api.errors import install_error_handlers, install_guard
from actors.api.frontend import Completion, Frontend
from actors.api.instrumentation import HttpMetrics
from actors.api.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DerenderRequest,
    GenerateRequest,
    RenderRequest,
)
from actors.api.streaming import stream, unless_client_leaves
from actors.render.parsers import ParsedDelta


def build_app(
    frontend: Frontend,
    metrics_text: Callable[[], Awaitable[str]],
    api_key: str | None = None,
    max_body_bytes: int = 4 * 1024**2,
) -> FastAPI:
    """The app around `frontend`; `metrics_text()` is the exposition `/metrics` serves."""
    app = FastAPI(title="disagg-testbed", docs_url=None, redoc_url=None)
    http_metrics = HttpMetrics(app)  # inside the guard, as vLLM's inside its API key check
    install_guard(app, api_key, max_body_bytes)
    install_error_handlers(app)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        text = await metrics_text() + http_metrics.exposition()
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    _openai_routes(app, frontend)
    _render_routes(app, frontend)
    return app


def _openai_routes(app: FastAPI, frontend: Frontend) -> None:
    """/v1/models, /v1/chat/completions, /v1/completions."""

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [responses.model_card(frontend)]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(req: ChatCompletionRequest, request: Request) -> Any:
        frontend.check_model(req.model)
        creq, replica = await frontend.chat_request_for(req)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return await stream(request, responses.chat_chunks(frontend, creq, replica, include_usage))
        done = await unless_client_leaves(request, frontend.complete(creq, replica))
        return responses.chat_completion(frontend, done)

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest, request: Request) -> Any:
        frontend.check_model(req.model)
        creq, replica = await frontend.completion_request_for(req)
        echo = await frontend.renders[replica].detokenize(creq.prompt_token_ids) if req.echo else ""
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            chunks = responses.completion_chunks(frontend, creq, replica, include_usage, echo)
            return await stream(request, chunks)
        done: Completion = await unless_client_leaves(request, frontend.complete(creq, replica, parse=False))
        return responses.text_completion(frontend, done, echo)


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
            "tool_calls": responses.tool_calls(parsed.tool_calls),
        }

    @app.post("/inference/v1/generate", response_model=None)
    async def generate(req: GenerateRequest, request: Request) -> Any:
        creq = frontend.generate_request(req)
        if req.stream:
            return await stream(request, responses.generate_chunks(frontend, creq))
        done = await unless_client_leaves(request, frontend.complete(creq, None))
        return {
            "request_id": done.request_id,
            "token_ids": done.output_token_ids,
            "finish_reason": done.finished_reason,
            "usage": responses.counts(len(done.prompt_token_ids), len(done.output_token_ids)),
        }
