"""A pool's engines as the proxy sees them: the engines (or clients of their actors) and the pool's router;
a request's outputs on one of them, dead engines dropped from routing, a prefill moved to another engine
when the one it is on dies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from typing import Protocol

from actors.engine.clock import Clock
from actors.engine.health import EngineDeadError
from actors.router import Router
from emulation.config import RouterConfig
from messages import ClientRequest, EngineOutput, EngineRequest, KVEvents, KVTransferParams, PrefillLeg


class EngineClient(Protocol):
    """An engine as the proxy sees it: the engine itself, or a handle to its actor."""

    engine_id: str

    def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]: ...

    async def kv_ready(self, request_id: str, kv_transfer_params: KVTransferParams) -> None:
        """Push: prefill finished `request_id`; its KV may now be pushed into this decode engine."""

    async def check_health(self) -> None:
        """Raise `EngineDeadError` if the engine is dead."""


class InProcessEngine(EngineClient, Protocol):
    """An engine in the proxy's process (virtual mode), whose KV events need not ride its outputs."""

    def listen_kv_events(self, listener: Callable[[KVEvents], None]) -> Callable[[], None]:
        """Hand this engine's KV events to `listener`; returns what brings them up to now."""
        ...


class EnginePool:
    """A pool's engines and their router."""

    def __init__(
        self,
        engines: Sequence[EngineClient],
        *,
        router: Router,
        cfg: RouterConfig | None = None,
        time_scale: Callable[[], float] = lambda: 1.0,
    ) -> None:
        """`cfg`: the retries and timeout of a prefill (None: neither); `time_scale`: the run's clock's
        wall seconds per emulated second (what a timeout waits)."""
        self.engines = list(engines)
        self.router = router
        self.cfg = cfg or RouterConfig(max_prefill_retries=0)
        self.time_scale = time_scale

    async def check_health(self) -> None:
        """Ask each engine in routing whether it lives; a dead one leaves routing for good (one taken
        out as unresponsive stays out until it answers a request: passing this says nothing of that)."""

        async def check(i: int) -> None:
            try:
                await self.engines[i].check_health()
            except EngineDeadError as e:
                self.router.excluded[i] = str(e)

        await asyncio.gather(*(check(i) for i in range(len(self.engines)) if i not in self.router.excluded))

    async def outputs(self, i: int, ereq: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        """`ereq` on engine `i`: its outputs. The engine's KV events go to the router, which is told
        when the request has ended there."""
        try:
            async with aclosing(self.engines[i].generate(ereq)) as outs:
                async for out in outs:
                    if self.router.excluded:  # it answers: back in routing (a dead engine never does)
                        self.router.excluded.pop(i, None)
                    if out.kv_events is not None:
                        self.router.on_kv_events(i, out.kv_events)
                    yield out
        except EngineDeadError as e:
            self.router.excluded[i] = str(e)
            raise
        finally:
            self.router.finished(ereq.request_id)

    async def prefill_on_a_live_engine(
        self,
        i: int,
        creq: ClientRequest,
        ereq: EngineRequest,
        leg: PrefillLeg,
    ) -> list[EngineOutput]:
        """A prefill's outputs on engine `i`, or, each time the engine it is on dies or gives no final
        output within `prefill_timeout_s`, on another one (at most `max_prefill_retries` times): a
        retry starts the prompt over. The request is aborted on an engine that timed out, and that
        engine taken out of routing until it answers again; unless no other could be picked (an
        overloaded pool is slow, not gone; outlier detection never ejects every host): then the request
        fails there. `leg` says where it ran, how many times it was retried or timed out, and (once
        it ran to its end) when its token came and the engine's record of it."""
        timeout_s = self.cfg.prefill_timeout_s
        timeout_wall_s = timeout_s * self.time_scale() if timeout_s is not None else None
        while True:
            leg.prefill_engine = self.engines[i].engine_id
            try:
                async with asyncio.timeout(timeout_wall_s):  # (prefill streams one or two outputs)
                    outs = [out async for out in self.outputs(i, ereq)]
            except TimeoutError:
                why = f"engine {self.engines[i].engine_id} gave no answer within router.prefill_timeout_s"
                leg.num_prefill_timeouts += 1
                others = set(range(len(self.engines))) - {i, *self.router.excluded}
                if others:
                    self.router.excluded[i] = why
                if not others or leg.num_prefill_retries == self.cfg.max_prefill_retries:
                    raise EngineUnresponsiveError(why) from None
            except EngineDeadError:
                if leg.num_prefill_retries == self.cfg.max_prefill_retries:
                    raise
            else:
                for out in outs:
                    if out.token_times_s:
                        leg.prefill_done_s = out.token_times_s[-1]
                leg.prefill_times = outs[-1].times if outs else None
                return outs
            leg.num_prefill_retries += 1
            i = self.router.pick(creq)


class EngineUnresponsiveError(RuntimeError):
    """An engine gave no answer in time (`router.prefill_timeout_s`): it is not routed to until it answers
    again (a pool's last engine stays in routing)."""


async def watch_health(
    pools: Sequence[EnginePool], clock: Clock, interval_s: float, until_s: float | None
) -> None:
    """Check every pool's engines' health every `interval_s` emulated seconds, until `until_s` (None:
    until cancelled)."""
    t = clock.now()
    while until_s is None or t < until_s:
        t += interval_s
        await clock.sleep_until(t)
        await asyncio.gather(*(pool.check_health() for pool in pools))
