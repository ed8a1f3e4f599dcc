"""The replay driver: sends each request at its arrival time and collects every result."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from messages import ClientRequest, RequestResult
from workloads.render_tier import RenderTier


class Clock(Protocol):
    """The run's one clock (`actors.engine.clock.Clock`), as the driver uses it."""

    async def sleep_until(self, sim_t: float) -> float: ...


async def replay(
    submit: Callable[[ClientRequest], Awaitable[RequestResult]],
    requests: Sequence[ClientRequest],
    clock: Clock,
    on_result: Callable[[RequestResult], None] | None = None,
    lead_s: float = 0.0,
    render: RenderTier | None = None,
) -> list[RequestResult]:
    """Submit requests on schedule (never waiting on earlier ones); results in request order.

    `lead_s` (emulated) sends each request that much ahead of its arrival time, to cover the real
    hops to the engine; engines hold a request until its arrival time.
    `render`: the render tier's cost model; each request's `render_s` comes from it (None: the
    requests' own `render_s`).
    """

    async def one(creq: ClientRequest) -> RequestResult:
        result = await submit(creq)
        if on_result is not None:
            on_result(result)
        return result

    tasks = []
    for creq in sorted(requests, key=lambda r: r.arrival_s):
        if render is not None:
            render_s = render.render_s(creq.arrival_s, len(creq.prompt_token_ids))
            creq = dataclasses.replace(creq, render_s=render_s)
        await clock.sleep_until(creq.arrival_s - lead_s)
        tasks.append(asyncio.ensure_future(one(creq)))
    results = await asyncio.gather(*tasks)
    order = {r.request_id: i for i, r in enumerate(requests)}
    return sorted(results, key=lambda r: order[r.request_id])
