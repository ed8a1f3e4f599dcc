"""A render replica's actor body (`RenderHost`) and its client (`actor_render`)."""

from __future__ import annotations

from typing import Any

from actors.render.client import METHODS, RenderClient, render_for
from cluster.hosts.common import serve_node_metrics
from dashboards.recorders import RenderMetrics
from emulation.config import TestbedConfig


class RenderHost:
    """The body of a render actor: one replica of the render pool (a sync actor: one call at a time, so
    renders queue on a busy replica as on a real render process)."""

    def __init__(self, cfg: TestbedConfig, replica: int) -> None:
        self._metrics = RenderMetrics(cfg, replica)
        self.render = render_for(cfg, self._metrics.on_render)

    def start(self) -> str:
        """Serve /metrics; returns its `host:port`."""
        return serve_node_metrics(self._metrics.registry)

    def call(self, method: str, *args: Any) -> Any:
        """`Render.<method>(*args)` on this replica (what `actor_render` clients send)."""
        if method not in METHODS:
            raise ValueError(
                f"render: {method!r} is not a render call; allowed: {', '.join(sorted(METHODS))}"
            )
        return getattr(self.render, method)(*args)

    def metrics(self) -> str:
        return self._metrics.exposition()

    def drain(self) -> None:
        """Check no stream is left open."""
        self.render.assert_empty()


def actor_render(handle: Any) -> RenderClient:
    """A client of a render actor (`RenderHost`); `close` is told, not awaited."""

    async def call(method: str, *args: Any) -> Any:
        return await handle.call.remote(method, *args)

    return RenderClient(call, lambda method, *args: handle.call.remote(method, *args))
