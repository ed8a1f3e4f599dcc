"""A pool's engines as the proxy sees them: the engines (or clients of their actors) and the pool's router;
a request's outputs on one of them, dead engines dropped from routing, a prefill moved to another engine
when the one it is on dies."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from typing import Any, Protocol

from actors.engine.core import EngineDeadError
from actors.router import Router
from messages import ClientRequest, EngineOutput, EngineRequest, KVEvents, RequestResult


class EngineClient(Protocol):
    """An engine as the proxy sees it: the engine itself, or a handle to its actor."""

    engine_id: str

    def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]: ...

    async def kv_ready(self, request_id: str, kv_transfer_params: dict[str, Any]) -> None:
        """Push: prefill finished `request_id`; its KV may now be pushed into this decode engine."""


class InProcessEngine(EngineClient, Protocol):
    """An engine in the proxy's process (virtual mode), whose KV events need not ride its outputs."""

    def listen_kv_events(self, listener: Callable[[KVEvents], None]) -> Callable[[], None]:
        """Hand this engine's KV events to `listener`; returns what brings them up to now."""
        ...


class EnginePool:
    """A pool's engines and their router."""

    def __init__(self, engines: Sequence[EngineClient], router: Router, max_prefill_retries: int = 0) -> None:
        self.engines = list(engines)
        self.router = router
        self.max_prefill_retries = max_prefill_retries

    async def outputs(self, i: int, ereq: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        """`ereq` on engine `i`: its outputs. The engine's KV events go to the router, which is told
        when the request has ended there."""
        try:
            async with aclosing(self.engines[i].generate(ereq)) as outs:
                async for out in outs:
                    if out.kv_events is not None:
                        self.router.on_kv_events(i, out.kv_events)
                    yield out
        except EngineDeadError as e:
            self.router.dead[i] = str(e)
            raise
        finally:
            self.router.finished(ereq.request_id)

    async def outputs_on_a_live_engine(
        self, i: int, creq: ClientRequest, ereq: EngineRequest, result: RequestResult
    ) -> AsyncGenerator[EngineOutput, None]:
        """A prefill's outputs on engine `i`, or, each time the engine it is on dies first, on another
        one (at most `max_prefill_retries` times): a retry starts the prompt over, and prefill yields
        only its final output. `result` says where it ran and how many times it was retried."""
        while True:
            result.prefill_engine = self.engines[i].engine_id
            try:
                async for out in self.outputs(i, ereq):
                    yield out
                return
            except EngineDeadError:
                if result.num_prefill_retries == self.max_prefill_retries:
                    raise
                result.num_prefill_retries += 1
                i = self.router.pick(creq)
