"""Closed-loop load: `workload.max_concurrency` requests in flight, the next sent when one finishes.

As `vllm bench serve --max-concurrency N` sends (at its default `--request-rate inf`: every request
ready at the start, a semaphore of N in front of the server) and genai-perf's `--concurrency N`::

    slot 1   ├─ req 0 ──────────┤├─ req 3 ────────────┤├─ req 5 ─ ...
    slot 2   ├─ req 1 ───┤├─ req 2 ───────┤├─ req 4 ───────────┤ ...
             0            ^ req 1 done: the next, req 2, is sent; its arrival_s is this moment

A request's clock starts when it is sent, as vLLM's does (its `start_time`, after the semaphore): its
`arrival_s` is that moment, so its TTFT counts everything after it (rendering, the proxy, an engine's
waiting queue) and nothing before (the time it waited for a slot, which vLLM reports apart as
`client_queue_time`). A slot frees when the request has finished, success or failure: at its last
token's time (`RequestResult.token_times_s`: when it reached the client), or when the failure or the
result reached this driver if that is later (live mode: the proxy actor's answer, as a real client's).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
from collections.abc import Awaitable, Callable, Sequence

from messages import ClientRequest, RequestResult
from workloads.render_tier import RenderTier
from workloads.session_replay import Clock


class ClosedLoop:
    """Sends a list of requests in order, `max_concurrency` at a time (their own arrival times unused)."""

    def __init__(
        self,
        submit: Callable[[ClientRequest], Awaitable[RequestResult]],
        clock: Clock,
        max_concurrency: int,
        render: RenderTier | None = None,
        on_result: Callable[[RequestResult], None] | None = None,
    ) -> None:
        """`render`: the render tier's cost model; each request's `render_s` comes from it, from its
        send time (None: the requests' own `render_s`)."""
        self.submit = submit
        self.clock = clock
        self.max_concurrency = max_concurrency
        self.render = render
        self.on_result = on_result

    async def run(self, requests: Sequence[ClientRequest]) -> list[RequestResult]:
        """Every request of `requests`, sent in their order; results in that order."""
        waiting = collections.deque(requests)  # shared by the slots: each takes the next once free
        results: dict[str, RequestResult] = {}
        await self.clock.sleep_until(0.0)  # (live: emulated time starts a moment after the actors)

        async def slot() -> None:
            while waiting:
                result = await self._send(waiting.popleft())
                results[result.request_id] = result
                if self.on_result is not None:
                    self.on_result(result)
                if waiting:
                    await self.clock.sleep_until(self._freed_s(result))

        await asyncio.gather(*(slot() for _ in range(min(self.max_concurrency, len(requests)))))
        return [results[creq.request_id] for creq in requests]

    def _freed_s(self, result: RequestResult) -> float:
        """When `result`'s slot frees: its last token's time, or now if later (a failure's, a late
        delivery's). In virtual time an engine may hand over a run of steady steps' tokens at the run's
        last step start (`actors.engine.window.run`), stamped up to its end: the client has them only then."""
        return max(self.clock.now(), result.token_times_s[-1] if result.token_times_s else -math.inf)

    async def _send(self, creq: ClientRequest) -> RequestResult:
        """`creq`, its arrival time now (and its render from now)."""
        creq = dataclasses.replace(creq, arrival_s=self.clock.now())
        if self.render is not None:
            creq = self.render.rendered(creq)
        return await self.submit(creq)
