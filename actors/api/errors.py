"""Errors as vLLM's OpenAI-compatible server shapes them, and the guard in front of every route.

Every error body is vLLM's `ErrorResponse`: `{"error": {"message": str, "type": str, "param": str | null,
"code": int}}`, where `code` is the HTTP status and `type` vLLM's name for it ("BadRequestError",
"NotFoundError", "InternalServerError"; the status phrase otherwise, e.g. "Bad Request" for a request
that fails validation, as vLLM's validation handler names it). A missing or wrong API key is vLLM's
`{"error": "Unauthorized"}`. A route that does not exist is FastAPI's `{"detail": "Not Found"}`, as in
vLLM. A request refused by one of vLLM's queue limits (`scheduler.max_num_queued_reqs`,
`max_num_queued_tokens`) is vLLM's 503: its message, `type` "Service Unavailable", `param` null, no
Retry-After, streamed or not (the engine refuses before a stream starts, as vLLM's check before
rendering does; vLLM checks again after rendering, and a stream it started by then carries the same
body as an error event). Two statuses vLLM 0.32 never answers keep its body shape: 413 (a body over
`--max-body-bytes`; vLLM reads any body and refuses an over-long prompt with a 400) and 429 with
Retry-After (the gateway's shedding: `scheduler.max_waiting`, `max_queue_time_s`).
"""

from __future__ import annotations

import json
import secrets
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

VLLM_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}
"""The `type` vLLM's `create_error_response` gives its own errors of these statuses."""
GUARDED_PREFIXES = ("/v1", "/inference", "/render", "/derender")
"""Paths an API key guards (vLLM's prefixes, and the render tier's): /health and /metrics stay open."""
MAX_DRAIN_BYTES = 256 * 1024**2
"""The most of a refused body read (and dropped) before answering: beyond it the connection closes."""
QUEUE_LIMIT_MESSAGES = {
    "max_num_queued_reqs": "The engine is currently busy and cannot accept new requests. "
    "Please try again later or on a different instance.",
    "max_num_queued_tokens": "The engine has reached its prefill token backlog limit. "
    "Please try again later or on a different instance.",
}
"""vLLM 0.32's messages for its queue limits (`QueueOverflowError`, `MaxQueuedTokensError`), by limit."""
RETRY_AFTER_S = 1
"""What a 429 (a request the gateway shed: scheduler.max_waiting, max_queue_time_s) asks the client to
wait, in seconds: a fixed hint (nothing predicts when a place in the queue frees)."""


def error_type(status: int) -> str:
    """vLLM's `type` for an error of `status`: its own name, or the HTTP status phrase."""
    if status in VLLM_ERROR_TYPES:
        return VLLM_ERROR_TYPES[status]
    try:
        return HTTPStatus(status).phrase
    except ValueError:  # 499, nginx's "client closed request": no HTTPStatus member
        return "Client Closed Request"


def error_body(
    message: str, status: int, param: str | None = None, type_: str | None = None
) -> dict[str, Any]:
    """vLLM's `ErrorResponse` as JSON: `code` is the status."""
    return {
        "error": {"message": message, "type": type_ or error_type(status), "param": param, "code": status}
    }


class ApiError(Exception):
    """An error answered with `status` and vLLM's error body (`error_body`)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type_: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type_ or error_type(status)
        self.headers = headers
        """Sent with the error (a 429's Retry-After)."""

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.status, self.param, self.type)


def rejection(request_id: str, rejected_by: str | None, why: str | None) -> ApiError:
    """The answer to a request refused by the limit `rejected_by` (`why`: the engine's account):
    vLLM's 503 past its queue limits, as vLLM's server shapes a `GracefulHTTPError` (its message, the
    status phrase as `type`, no `param`); a 429 with Retry-After past the gateway's."""
    if rejected_by in QUEUE_LIMIT_MESSAGES:
        return ApiError(503, QUEUE_LIMIT_MESSAGES[rejected_by])
    message = f"request {request_id} rejected: {why}; retry later"
    return ApiError(429, message, headers={"Retry-After": str(RETRY_AFTER_S)})


def install_error_handlers(app: FastAPI) -> None:
    """`ApiError` and FastAPI's validation errors as vLLM's error bodies."""

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
        body = error_body(message, 400, loc or None, HTTPStatus.BAD_REQUEST.phrase)
        return JSONResponse(body, status_code=400)


def install_guard(app: FastAPI, api_key: str | None, max_body_bytes: int) -> None:
    """The API key (vLLM's 401) and the body size limit (413), checked before any route."""

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Response:
        if api_key is not None and request.url.path.startswith(GUARDED_PREFIXES):
            sent = request.headers.get("authorization", "")
            if not secrets.compare_digest(sent, f"Bearer {api_key}"):
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > max_body_bytes:
            await _drain(request, int(size))
            message = f"request body: {int(size)} bytes; allowed: at most {max_body_bytes} bytes"
            return JSONResponse(error_body(message, 413), status_code=413)
        return await call_next(request)  # type: ignore[no-any-return]


async def _drain(request: Request, size: int) -> None:
    """Read a refused body to its end (chunk by chunk, kept nowhere) before the 413: a client still
    writing when the server answers and closes sees the connection reset, not the answer (Python's
    urllib does; curl, `requests` and httpx read the answer early). Not when the client waits for
    `100 Continue` (it sends nothing unless asked), nor past `MAX_DRAIN_BYTES`."""
    if request.headers.get("expect", "").lower() == "100-continue" or size > MAX_DRAIN_BYTES:
        return
    async for _ in request.stream():
        pass
