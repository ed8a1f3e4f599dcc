"""The request streams: tokens an engine produced and its clients have not taken yet.

The step loop pushes each token (with its emulated stamp) and the final output; a client's iterator
wakes and takes everything pending at once, so a consumer that falls behind gets one coalesced output
instead of one per step. Where nobody reads tokens as they come (a virtual run with
`runner.macro_steps`: its clients keep the stamps, and a KV router takes the engine's events in
process), only the final output wakes the client: one output a request instead of one a step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

from messages import EngineOutput, KVEvents


class RequestStream:
    """Tokens produced for one request and not yet taken by its consumer."""

    __slots__ = ("event", "final", "times", "tokens")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.times: list[float] = []
        self.event = asyncio.Event()
        self.final: EngineOutput | None = None
        """The request's last output (finished_reason set), once it ended."""

    async def outputs(
        self, request_id: str, take_kv_events: Callable[[], KVEvents | None]
    ) -> AsyncGenerator[EngineOutput, None]:
        """Everything pending at each wake-up, as one output (with the engine's KV events since its last
        output, if any); ends after the final one."""
        while True:
            await self.event.wait()
            self.event.clear()
            out = self.final or EngineOutput(request_id, [], [])
            out.new_token_ids = self.tokens
            out.token_times_s = self.times
            out.kv_events = take_kv_events()
            self.tokens = []
            self.times = []
            yield out
            if out.finished_reason is not None:
                return


class OutputStreams:
    """The open streams of one engine, by request id."""

    def __init__(self) -> None:
        self.wake_on_tokens = True
        """Wake a client at each push (False: only at its request's end; the engine's windows say)."""
        self._streams: dict[str, RequestStream] = {}
        self._hand_over: tuple[Callable[[], KVEvents | None], Callable[[KVEvents], None]] | None = None

    def hand_over_kv_events(
        self, take: Callable[[], KVEvents | None], listener: Callable[[KVEvents], None]
    ) -> None:
        """Give the engine's KV events (`take`) to `listener` whenever an output reaches an open stream,
        when its client would take them, instead of on the outputs (an in-process router's)."""
        self._hand_over = take, listener

    def _on_output(self) -> None:
        if self._hand_over is not None and (events := self._hand_over[0]()):
            self._hand_over[1](events)

    def open(self, request_id: str) -> RequestStream:
        stream = self._streams[request_id] = RequestStream()
        return stream

    def close(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    def push(self, request_id: str, token: int, time_s: float) -> None:
        self.push_many(request_id, [token], [time_s])

    def push_many(self, request_id: str, tokens: list[int], times_s: list[float]) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.tokens += tokens
            stream.times += times_s
            if self.wake_on_tokens:
                stream.event.set()
            self._on_output()

    def finish(self, output: EngineOutput) -> None:
        stream = self._streams.get(output.request_id)
        if stream is not None:
            stream.final = output
            stream.event.set()
            self._on_output()

    def assert_empty(self, engine_id: str) -> None:
        assert not self._streams, f"{engine_id}: streams left: {list(self._streams)[:10]}"
