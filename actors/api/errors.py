"""Errors as vLLM's OpenAI-compatible server shapes them, and the guard in front of every route.

Every error body is vLLM's `ErrorResponse`: `{"error": {"message": str, "type": str, "param": str | null,
"code": int}}`, where `code` is the HTTP status and `type` vLLM's name for it ("BadRequestError",
"NotFoundError", "InternalServerError"; the status phrase otherwise, e.g. "Bad Request" for a request
that fails validation, as vLLM's validation handler names it). A missing or wrong API key is vLLM's
`{"error": "Unauthorized"}`. A route that does not exist is FastAPI's `{"detail": "Not Found"}`, as in
vLLM. Two statuses vLLM 0.32 never answers keep its body shape: 413 (a body over `--max-body-bytes`;
vLLM reads any body and refuses an over-long prompt with a 400) and 429 (an engine's admission limit;
vLLM refuses past `--max-num-queued-reqs` with a 503).
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
