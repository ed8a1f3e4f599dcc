"""Server-sent events and the client that leaves: a stream's status waits for its first chunk, a failure
after it is an error event, and a client that hangs up cancels its request everywhere."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from contextlib import aclosing
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

from actors.api.errors import ApiError

T = TypeVar("T")


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def unless_client_leaves(request: Request, work: Awaitable[T]) -> T:
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
        raise ApiError(499, "the client closed the connection")
    return task.result()


async def _disconnected(request: Request) -> None:
    """Until the client hangs up (its body was read: what is left to receive is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def stream(request: Request, chunks: AsyncGenerator[str, None]) -> StreamingResponse:
    """An SSE response whose first chunk was awaited before it starts: a request refused before its
    first token (a 503 or 429 at admission, a 500) gets that status, not a 200 and an error event."""
    try:
        first = await unless_client_leaves(request, anext(chunks, None))
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
    """SSE framing: a failure after the stream started is an error event (vLLM's error body; the status
    line is already sent), then `[DONE]`. A client that leaves closes `chunks` at once, which aborts
    its request."""
    async with aclosing(chunks):
        try:
            async for chunk in chunks:
                yield chunk
        except ApiError as e:
            yield sse(e.body())
    yield "data: [DONE]\n\n"
