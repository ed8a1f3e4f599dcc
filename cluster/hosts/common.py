"""Helpers every actor body shares: streams across actors, and serving a node's metrics."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import ray

from dashboards.exposition import serve_metrics


async def remote_stream(method: Any, *args: Any) -> AsyncGenerator[Any, None]:
    """The items of a streaming actor method; the actor's task is cancelled if the consumer stops early."""
    gen = method.options(num_returns="streaming").remote(*args)
    done = False
    try:
        async for ref in gen:
            yield await ref
        done = True
    finally:
        if not done:
            ray.cancel(gen)


def serve_node_metrics(registry: Any) -> str:
    """Serve `registry` at /metrics on this node's address and a free port (scraped via file SD)."""
    host = ray.util.get_node_ip_address()
    return f"{host}:{serve_metrics(registry, host)}"
