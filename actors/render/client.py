"""A render replica as the front end and the proxy call it: one client, two transports.

    RenderClient ── call(method, *args) ──► Render     in this process (`local_render`)
                                       └──► RenderHost  a Ray actor (`cluster.hosts.actor_render`)

Every call names a `Render` method and its arguments; the transport decides how it gets there. Calls
are per request (render) or per engine batch (derender), never per token: a remote replica costs one
actor round trip each.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actors.render.parsers import ParsedDelta
from messages import RenderedPrompt, RenderSpec

if TYPE_CHECKING:  # transformers loads where a replica renders, not in every actor that calls one
    from actors.render.render import Render
    from emulation.config import TestbedConfig

Call = Callable[..., Awaitable[Any]]
"""`call(method, *args)`: the result of `Render.<method>(*args)` on the replica, awaited."""

METHODS = frozenset({"render_spec", "render_text", "derender", "derender_stateless", "detokenize", "close"})
"""The `Render` methods a client may call."""


class RenderClient:
    def __init__(self, call: Call, tell: Callable[..., None]) -> None:
        """`tell(method, *args)`: a call whose answer nobody waits for (a remote replica is told)."""
        self._call = call
        self._tell = tell

    async def render_spec(self, spec: RenderSpec) -> RenderedPrompt:
        rendered: RenderedPrompt = await self._call("render_spec", spec)
        return rendered

    async def render_text(self, text: str) -> list[int]:
        ids: list[int] = await self._call("render_text", text)
        return ids

    async def derender(
        self, stream_id: str, new_token_ids: list[int], finished: bool, parse: bool = True
    ) -> list[ParsedDelta]:
        deltas: list[ParsedDelta] = await self._call("derender", stream_id, new_token_ids, finished, parse)
        return deltas

    async def derender_stateless(
        self, all_token_ids: list[int], num_done: int, finished: bool, parse: bool = True
    ) -> list[ParsedDelta]:
        deltas: list[ParsedDelta] = await self._call(
            "derender_stateless", all_token_ids, num_done, finished, parse
        )
        return deltas

    async def detokenize(self, token_ids: Sequence[int]) -> str:
        text: str = await self._call("detokenize", token_ids)
        return text

    def close(self, stream_id: str) -> None:
        """Drop a stream that will not finish; returns at once."""
        self._tell("close", stream_id)


_ON_LOOP = frozenset({"derender", "close"})
"""In process, a stream's derender (O(new tokens)) runs on the event loop; template and tokenizer
work, and a stateless replay (O(output so far)), run off it: the engines may share the loop."""


def local_render(render: Render) -> RenderClient:
    """A client of a replica in this process."""

    async def call(method: str, *args: Any) -> Any:
        fn = getattr(render, method)
        return fn(*args) if method in _ON_LOOP else await asyncio.to_thread(fn, *args)

    return RenderClient(call, lambda method, *args: getattr(render, method)(*args))


def render_for(cfg: TestbedConfig, on_render: Callable[[str, float, int], None] | None = None) -> Render:
    """A render replica for `cfg`: its tokenizer and chat template (the project's unless `cfg.render`
    names local ones), and its target's image processor."""
    from actors.render.render import Render
    from actors.render.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(cfg.render.tokenizer_path, cfg.runner.vocab_size)
    template = Path(cfg.render.chat_template_path).read_text() if cfg.render.chat_template_path else None
    return Render(tokenizer, template, on_render=on_render, target_model=cfg.target.model)


def render_again(clients: Sequence[RenderClient]) -> Callable[[RenderSpec], Awaitable[list[int]]]:
    """The proxy's renderer for P/D decode when prefill's prompt IDs cannot be reused: each request on
    the next of `clients`."""
    replicas = itertools.cycle(clients)

    async def render(spec: RenderSpec) -> list[int]:
        return (await next(replicas).render_spec(spec)).token_ids

    return render
