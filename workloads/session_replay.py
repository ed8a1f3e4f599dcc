"""Replaying a trace's sessions: each session's turns in closed loop, sessions side by side.

A turn is sent only after the session's previous turn finished, then waits as the timing says::

    think        prev done ── think_s ──► send             (the default: faithful load for agents)
    original     max(prev done, the turn's trace time)     (open loop where the system keeps up)
    api-scaled   max(prev done, prev sent + api_s x scale + think_s)

all divided by `speedup`. A turn's sub-agents start when it has finished and the session's next turn
waits for all of them. One-turn sessions (traces without sessions) are plain open loop: each request at
its timestamp. At most `max_sessions` top-level sessions run at once; a session waits for a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Protocol

import numpy as np
import xxhash

from emulation.config import ReplayConfig
from messages import ClientRequest, RenderSpec, RequestResult
from messages.token_ids import PromptIds
from workloads.harness import Harness
from workloads.images import synthetic_image, with_images
from workloads.render_tier import RenderTier
from workloads.traces.session import ChatPrompt, FollowUp, Session, Trace, Turn
from workloads.traces.tokens import TokenSynthesizer


class Clock(Protocol):
    """The run's one clock (`actors.engine.clock.Clock`), as the replay drivers use it."""

    def now(self) -> float: ...

    async def sleep_until(self, sim_t: float) -> float: ...


class SessionReplay:
    def __init__(
        self,
        submit: Callable[[ClientRequest], Awaitable[RequestResult]],
        clock: Clock,
        synth: TokenSynthesizer,
        cfg: ReplayConfig,
        render: RenderTier | None = None,
        on_result: Callable[[RequestResult], None] | None = None,
        lead_s: float = 0.0,
        forced: bool = True,
        images: tuple[bool, int | None] = (False, None),
    ) -> None:
        """`lead_s`: send each request that much ahead of its time (live mode: the real hops).
        `forced`: answers are the tokens the next turn repeats (False: the runner's greedy tokens,
        which a trace's next prompt does not contain). `images`: whether a turn's images go as images
        (a vision-language target; else as as many random prompt tokens), and the pixel size of their
        patches (real compute; None: no patches)."""
        self.forced = forced
        self.images, self.patch_size = images
        self.submit = submit
        self.clock = clock
        self.synth = synth
        self.cfg = cfg
        self.render = render
        self.on_result = on_result
        self.lead_s = lead_s
        self.results: list[RequestResult] = []
        self._template_kwargs = dict(cfg.chat_template_kwargs or {})
        self._tools = list(cfg.tools) if cfg.tools else None

    async def run(self, trace: Trace) -> list[RequestResult]:
        """Every session of `trace` (within the window, cut to `max_turns`) to its end; results in send
        order."""
        sessions = trace.replayed(self.cfg.window_s, self.cfg.max_turns).sessions
        offset_s = self.cfg.window_s[0] if self.cfg.window_s is not None else 0.0
        slots = asyncio.Semaphore(self.cfg.max_sessions) if self.cfg.max_sessions else None
        await asyncio.gather(*(self._top(s, offset_s, slots) for s in sessions))
        return sorted(self.results, key=lambda r: r.arrival_s)

    async def _top(self, session: Session, offset_s: float, slots: asyncio.Semaphore | None) -> None:
        origin_s = (session.start_s - offset_s) / self.cfg.speedup
        await self.clock.sleep_until(origin_s - self.lead_s)
        async with slots if slots is not None else contextlib.nullcontext():
            await self._session(session, max(origin_s, self.clock.now()))

    async def _session(self, session: Session, origin_s: float) -> float:
        """Run `session` from `origin_s` (emulated: when its first turn's trace time falls); returns when
        its last turn (and every sub-agent) finished. Times come from the results' emulated stamps, so
        live mode paces exactly as virtual mode does."""
        sent_s = done_s = origin_s
        turns = session.turns
        harness = Harness(self.cfg, self.synth.vocab_size)
        for k, turn in enumerate(turns):
            due_s = self._due_s(session, k, origin_s, sent_s, done_s)
            await self.clock.sleep_until(due_s - self.lead_s)
            nxt = turns[k + 1] if k + 1 < len(turns) else None
            result = await self._send(session, k, turn, nxt, due_s, harness)
            sent_s, done_s = due_s, (result.token_times_s[-1] if result.token_times_s else due_s)
            if turn.subagents:
                ends = await asyncio.gather(*(self._session(sub, done_s) for sub in turn.subagents))
                done_s = max(done_s, *ends)
        return done_s

    def _add_images(self, creq: ClientRequest, turn: Turn, rid: str) -> None:
        """`turn`'s images before `creq`'s prompt (`workloads.images`), drawn for the request id."""
        rng = np.random.default_rng([self.synth.seed, xxhash.xxh3_64_intdigest(rid.encode())])
        if not self.images:  # a text-only target: the visual tokens as prompt tokens
            extra = rng.integers(0, self.synth.vocab_size, sum(turn.image_tokens)).tolist()
            creq.prompt_token_ids = extra + creq.prompt_token_ids
            return
        items = [synthetic_image(rng, n, self.patch_size) for n in turn.image_tokens]
        creq.prompt_token_ids, creq.mm_items = with_images(
            creq.prompt_token_ids, items, self.synth.vocab_size
        )

    def _due_s(
        self, session: Session, k: int, origin_s: float, prev_sent_s: float, prev_done_s: float
    ) -> float:
        """When turn `k` is due (emulated), by the timing strategy (see the module's docstring)."""
        turn, speedup, timing = session.turns[k], self.cfg.speedup, self.cfg.timing
        think_s = turn.think_s / speedup
        if k == 0:
            return origin_s if timing == "original" else origin_s + think_s
        if timing == "original":
            return max(prev_done_s, origin_s + (turn.t_s - session.turns[0].t_s) / speedup)
        api_s = session.turns[k - 1].api_s
        if timing == "api-scaled" and api_s is not None:
            return max(prev_done_s, prev_sent_s + api_s * self.cfg.api_time_scale / speedup + think_s)
        return prev_done_s + think_s

    async def _send(
        self, session: Session, k: int, turn: Turn, nxt: Turn | None, sent_s: float, harness: Harness
    ) -> RequestResult:
        """Send turn `k` as the session's `harness` builds it, and tell it the answer."""
        root = session.session_id.split("/")[0]
        salt = f"/{root}" if self.cfg.session_salt else ""
        spec = None
        prompt: PromptIds
        if isinstance(turn.prompt, FollowUp):
            prompt = harness.follow_up_ids(turn.prompt)
        elif isinstance(turn.prompt, ChatPrompt) and self.cfg.history == "model":
            spec = RenderSpec(harness.messages(turn.prompt), self._tools, self._template_kwargs)
            assert self.synth.render_chat is not None, "a chat trace needs the render tier (render_chat)"
            prompt = self.synth.render_chat(spec.messages)
        else:
            prompt = self.synth.tokens(turn.prompt, salt)
            if isinstance(turn.prompt, ChatPrompt):
                spec = RenderSpec(list(turn.prompt.messages), self._tools, self._template_kwargs)
        following = nxt is not None and not isinstance(nxt.prompt, FollowUp)
        next_prompt = self.synth.tokens(nxt.prompt, salt) if nxt is not None and following else None
        rid = f"{session.session_id}#{k}"
        creq = ClientRequest(
            request_id=rid,
            arrival_s=sent_s,
            prompt_token_ids=prompt,
            max_tokens=turn.max_tokens,
            forced_output_token_ids=(
                self.synth.answer(prompt, next_prompt, turn.max_tokens, rid) if self.forced else None
            ),
            session_id=session.session_id,
            turn=k,
            parent_session_id=session.parent,
            render=spec,
        )
        if turn.image_tokens:
            self._add_images(creq, turn, rid)
        if self.render is not None:
            creq = self.render.rendered(creq)
        result = await self.submit(creq)
        harness.answered(prompt, result, nxt.prompt if nxt is not None else None)
        self.results.append(result)
        if self.on_result is not None:
            self.on_result(result)
        return result
