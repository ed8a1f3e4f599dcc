"""A render replica as the front end and the proxy call it: awaited, in this process (`LocalRender`) or
as a Ray actor (`cluster.hosts.RemoteRender`); the render pool is a list of them.

Calls are per request (render) or per engine batch (derender), never per token: a remote replica
costs one actor round trip each.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from actors.messages import RenderSpec
from actors.render.parsers import ParsedDelta

if TYPE_CHECKING:  # transformers loads where a replica renders, not in every actor that calls one
    from actors.render.render import Render
    from cluster.config import TestbedConfig


class RenderClient(Protocol):
    async def render_chat(self, spec: RenderSpec) -> list[int]: ...

    async def render_text(self, text: str) -> list[int]: ...

    async def derender(
        self, stream_id: str, new_token_ids: list[int], finished: bool, parse: bool = True
    ) -> list[ParsedDelta]: ...

    async def derender_stateless(
        self, all_token_ids: list[int], num_done: int, finished: bool, parse: bool = True
    ) -> list[ParsedDelta]: ...

    async def detokenize(self, token_ids: list[int]) -> str: ...

    def close(self, stream_id: str) -> None:
        """Drop a stream that will not finish; returns at once (a remote replica is told, not awaited)."""


def render_for(cfg: TestbedConfig, on_render: Callable[[str, float, int], None] | None = None) -> Render:
    """A render replica for `cfg`: its tokenizer and chat template (the project's unless `cfg.render`
    names local ones)."""
    from actors.render.render import Render
    from actors.render.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(cfg.render.tokenizer_path, cfg.runner.vocab_size)
    template = Path(cfg.render.chat_template_path).read_text() if cfg.render.chat_template_path else None
    return Render(tokenizer, template, on_render=on_render)


def render_again(clients: Sequence[RenderClient]) -> Callable[[RenderSpec], Awaitable[list[int]]]:
    """The proxy's renderer for P/D decode when prefill's prompt IDs cannot be reused: each request on
    the next of `clients`."""
    replicas = itertools.cycle(clients)

    async def render(spec: RenderSpec) -> list[int]:
        return await next(replicas).render_chat(spec)

    return render


class LocalRender:
    """A replica in this process: template and tokenizer work runs off the event loop (the engines may
    share it); a stream's derender (O(new tokens)) runs on it."""

    def __init__(self, render: Render) -> None:
        self.render = render

    async def render_chat(self, spec: RenderSpec) -> list[int]:
        return await asyncio.to_thread(self.render.render_spec, spec)

    async def render_text(self, text: str) -> list[int]:
        return await asyncio.to_thread(self.render.render_text, text)

    async def derender(
        self, stream_id: str, new_token_ids: Sequence[int], finished: bool, parse: bool = True
    ) -> list[ParsedDelta]:
        return self.render.derender(stream_id, new_token_ids, finished, parse)

    async def derender_stateless(
        self, all_token_ids: list[int], num_done: int, finished: bool, parse: bool = True
    ) -> list[ParsedDelta]:
        """Off the event loop: a replay is O(output so far)."""
        return await asyncio.to_thread(
            self.render.derender_stateless, all_token_ids, num_done, finished, parse
        )

    async def detokenize(self, token_ids: list[int]) -> str:
        return await asyncio.to_thread(self.render.detokenize, token_ids)

    def close(self, stream_id: str) -> None:
        self.render.close(stream_id)
