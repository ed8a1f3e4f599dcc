"""The API front end: turns OpenAI requests into token-ID requests for the proxy and token streams back
into OpenAI responses, paced by emulated time.

    HTTP ─► render (template -> token IDs) ─► proxy ─► engines (token IDs only)
    HTTP ◄─ derender (stateful stream: text, reasoning, tool calls) ◄─ token batches (emulated stamps)

Each token leaves when the clock reaches its emulated stamp, so a client measures the emulated TTFT and
ITL. Every finished request, whatever its outcome, is appended to `results` (unless told to keep none).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Protocol

from actors.api.errors import ApiError, rejection
from actors.api.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest
from actors.api.requests import RequestBuilder
from actors.engine.clock import Clock
from actors.render.client import RenderClient
from actors.render.images import ImageError
from actors.render.parsers import ParsedDelta
from actors.render.render import Render
from emulation.config import TestbedConfig
from messages import ClientRequest, EngineOutput, RenderedPrompt, RenderSpec, RequestResult
from messages.token_ids import PromptIds


@dataclass
class TokenEvent:
    """What the front end streams: the tokens that just became due, and what they derender to."""

    token_ids: list[int]
    delta: ParsedDelta
    finished_reason: str | None = None


@dataclass
class Completion:
    """A whole (or failed) request as the HTTP layer answers it."""

    request_id: str
    prompt_token_ids: PromptIds
    output_token_ids: list[int] = field(default_factory=list)
    parsed: ParsedDelta = field(default_factory=ParsedDelta)
    finished_reason: str | None = None
    cache: PromptCache | None = None
    """What the prefix cache did for its prompt (once finished)."""
    num_reasoning_tokens: int = 0
    """Output tokens that showed reasoning."""


@dataclass(frozen=True)
class PromptCache:
    """vLLM's `usage.prompt_tokens_details` counts of one request, where its prompt was computed (the
    prefill engine in P/D, the mixed one collocated)."""

    cached_tokens: int
    """Prompt tokens served from the prefix cache."""
    created_cache_tokens: int
    """Prompt tokens computed and written to the prefix cache: its full blocks beyond the hit."""

    @classmethod
    def of(cls, result: RequestResult, block_size: int, enable_prefix_caching: bool) -> PromptCache:
        """Without prefix caching no block is hashed, so none is written to the cache (vLLM: 0)."""
        times = result.prefill.prefill_times or result.times
        cached = times.num_cached_tokens if times is not None else 0
        full = result.num_prompt_tokens // block_size * block_size
        return cls(cached, max(0, full - cached) if enable_prefix_caching else 0)


class ProxyClient(Protocol):
    """The proxy as the front end sees it: the proxy itself, or a handle to its actor."""

    def stream(self, creq: ClientRequest, result: RequestResult) -> AsyncGenerator[EngineOutput, None]: ...


class Frontend:
    def __init__(
        self,
        cfg: TestbedConfig,
        *,
        proxy: ProxyClient,
        renders: list[RenderClient],
        clock: Clock,
        answers: Render,
        keep_results: bool = True,
    ) -> None:
        """`renders`: the render pool (stateful streams stick to the replica that opened them).
        `answers`: this process's copy of the tokenizer, for the workload's forced answers and stop IDs
        (choosing the output is the emulated model's job, not the render tier's). `keep_results`: keep
        each request's row for the end (a server without `--out` keeps none: its memory stays flat)."""
        self.keep_results = keep_results
        self.cfg = cfg
        self.proxy = proxy
        self.renders = renders
        self.clock = clock
        self.requests = RequestBuilder(cfg, answers)
        self.model_name = cfg.target.served_model_name or cfg.target.model
        self.results: list[RequestResult] = []
        self._next_render = itertools.cycle(range(len(renders)))

    # ---- requests --------------------------------------------------------------------------------

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise ApiError(
                404, f"model {model!r} does not exist; this server serves {self.model_name!r}", "model"
            )

    @staticmethod
    def render_spec(req: ChatCompletionRequest | Any) -> RenderSpec:
        return RenderSpec(
            [m.for_template() for m in req.messages], req.tools, dict(req.chat_template_kwargs or {})
        )

    async def chat_request_for(self, req: ChatCompletionRequest) -> tuple[ClientRequest, int]:
        """Render `req` and build its token-ID request, and the render replica its stream derenders on
        (the one that rendered it). The request arrived when this was called (TTFT counts rendering, as
        vLLM's does). Prompt token IDs a P/D proxy sends in `kv_transfer_params` are used as they are:
        rendering is skipped, unless the request needs it (non-text content, echo)."""
        arrival_s = self.clock.now()
        replica = next(self._next_render)
        spec = self.render_spec(req)
        given = self.requests.transfer_prompt(req)
        rendered = RenderedPrompt(given) if given is not None else await self.render(spec, replica)
        creq = await asyncio.to_thread(self.requests.chat, req, rendered.token_ids, spec, arrival_s)
        creq.mm_items = rendered.mm_items
        return self._rendered(creq), replica

    async def render(self, spec: RenderSpec, replica: int | None = None) -> RenderedPrompt:
        """Render on pool replica `replica` (None: the next)."""
        i = next(self._next_render) if replica is None else replica
        try:
            return await self.renders[i].render_spec(spec)
        except Exception as e:  # a bad image, or a template error (e.g. a role it rejects): the request's
            cause = getattr(e, "cause", None) or e  # on Ray: the replica's exception, wrapped
            if isinstance(cause, ImageError):
                raise ApiError(400, str(cause), cause.where) from None
            raise ApiError(400, f"messages: the chat template rejected them: {e}", "messages") from None

    async def completion_request_for(self, req: CompletionRequest) -> tuple[ClientRequest, int]:
        """Tokenize `req` on the render pool and build its token-ID request (arrived when called)."""
        arrival_s = self.clock.now()
        replica = next(self._next_render)
        if isinstance(req.prompt, str):
            prompt = await self.renders[replica].render_text(req.prompt)
        else:
            prompt = self.requests.check_token_ids(req.prompt, "prompt")
        creq = await asyncio.to_thread(self.requests.completion, req, prompt, arrival_s)
        return self._rendered(creq), replica

    def _rendered(self, creq: ClientRequest) -> ClientRequest:
        """`creq`, rendered now: the time since it arrived goes on its emulated path (`render_s`)."""
        creq.render_s = max(0.0, self.clock.now() - creq.arrival_s)
        return creq

    def generate_request(self, req: GenerateRequest) -> ClientRequest:
        """The token-ID request of `/inference/v1/generate` (arrived when called)."""
        return self.requests.generate(req, self.clock.now())

    # ---- streams ---------------------------------------------------------------------------------

    async def events(
        self,
        creq: ClientRequest,
        replica: int | None,
        parse: bool = True,
        result: RequestResult | None = None,
    ) -> AsyncGenerator[TokenEvent, None]:
        """Serve `creq`, yielding tokens as their emulated time comes (derendered on `replica`, parsed
        into reasoning and tool calls unless not `parse`; None: token IDs only). Closing the iterator
        early aborts the request everywhere. `result`: the record to fill (the caller reads it once
        the iterator is done), else one of its own."""
        render = self.renders[replica] if replica is not None else None
        stateless = self.cfg.render.derender == "stateless"
        result = result if result is not None else RequestResult.for_request(creq)
        stream_id = creq.request_id
        history: list[int] = []  # what a stateless render tier is sent again with every batch
        try:
            async with aclosing(self.proxy.stream(creq, result)) as outs:
                async for out in outs:
                    if out.finished_reason == "rejected":
                        break  # refused by a queue limit, nothing computed: a 503 or 429 below, no event
                    finished = out.finished_reason is not None
                    ids = out.new_token_ids
                    if render is None:
                        deltas = [ParsedDelta() for _ in ids] or [ParsedDelta()]
                    elif stateless:  # any replica: no state is kept between batches
                        history += ids
                        anyone = self.renders[next(self._next_render)]
                        num_done = len(history) - len(ids)
                        deltas = await anyone.derender_stateless(history, num_done, finished, parse)
                    else:  # the batch at once, its tokens released one by one
                        deltas = await render.derender(stream_id, ids, finished, parse)
                    for i, (tok, t) in enumerate(zip(ids, out.token_times_s, strict=True)):
                        await self.clock.sleep_until(t)
                        last = finished and i == len(ids) - 1
                        yield TokenEvent([tok], deltas[i], out.finished_reason if last else None)
                    if finished and not ids:
                        yield TokenEvent([], deltas[0], out.finished_reason)
        finally:
            if render is not None and not stateless:  # a stateless tier keeps nothing to drop
                render.close(stream_id)
            if self.keep_results:
                self.results.append(result)
        if result.finished_reason == "error":  # not when closed early: that was the client's choice
            raise ApiError(500, f"request {creq.request_id} failed: {result.error}")
        if result.finished_reason == "rejected":  # a queue limit: the client may try again soon
            raise rejection(creq.request_id, result.rejected_by, result.error)

    async def complete(self, creq: ClientRequest, replica: int | None, parse: bool = True) -> Completion:
        """A whole response (still paced: it returns when its last token is due)."""
        done = Completion(creq.request_id, creq.prompt_token_ids)
        result = RequestResult.for_request(creq)
        async with aclosing(self.events(creq, replica, parse, result)) as events:  # cancelled: aborted
            async for ev in events:
                done.output_token_ids += ev.token_ids
                done.parsed.extend(ev.delta)
                done.num_reasoning_tokens += bool(ev.delta.reasoning_content)
                done.finished_reason = ev.finished_reason or done.finished_reason
        done.cache = self.prompt_cache(result)
        return done

    def prompt_cache(self, result: RequestResult) -> PromptCache:
        """What the prefix cache did for a finished request's prompt."""
        s = self.cfg.scheduler
        return PromptCache.of(result, s.block_size, s.enable_prefix_caching)

    @staticmethod
    def openai_finish_reason(engine_reason: str | None, parsed: ParsedDelta) -> str | None:
        if engine_reason == "stop" and parsed.tool_calls:
            return "tool_calls"
        return engine_reason

    @staticmethod
    def created() -> int:
        return int(time.time())
