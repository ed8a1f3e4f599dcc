"""The proxy: routes each client request through the engines and tells its story.

collocated:  client -> mixed engine i (round robin over the data-parallel replicas)
P/D:         client -> prefill engine (max_tokens=1, do_remote_decode) -> first token + KV descriptor
                    -> decode engine (kv_transfer_params from prefill) -> pulls the KV -> stream
The client's first token in P/D is decode's, as with vLLM's P/D proxies.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from actors.messages import ClientRequest, EngineOutput, EngineRequest, RequestResult
from dashboards.metrics import ProxyMetrics


class EngineClient(Protocol):
    """An engine as the proxy sees it: the engine itself, or a handle to its actor."""

    engine_id: str

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]: ...


class Proxy:
    def __init__(
        self,
        mixed: Sequence[EngineClient] = (),
        prefill: Sequence[EngineClient] = (),
        decode: Sequence[EngineClient] = (),
        metrics: ProxyMetrics | None = None,
    ) -> None:
        """`metrics`: where finished requests are recorded (the client's view); None records nothing."""
        self.metrics = metrics
        if bool(mixed) == bool(prefill and decode):
            raise ValueError("a proxy needs mixed engines, or prefill and decode engines")
        self._mixed = itertools.cycle(mixed) if mixed else None
        self._prefill = itertools.cycle(prefill) if prefill else None
        self._decode = itertools.cycle(decode) if decode else None

    async def submit(self, creq: ClientRequest) -> RequestResult:
        """Serve one request to the end; failures are recorded in the result, never raised."""
        result = RequestResult(creq.request_id, creq.arrival_s, len(creq.prompt_token_ids), creq.max_tokens)
        try:
            if self._mixed is not None:
                await self._stream(
                    next(self._mixed),
                    self._engine_request(creq, creq.max_tokens, creq.arrival_s, None),
                    result,
                )
            else:
                await self._disaggregated(creq, result)
        except Exception as e:
            result.finished_reason, result.error = "error", f"{type(e).__name__}: {e}"
        if self.metrics is not None:
            self.metrics.on_request_done(result)
        return result

    async def _disaggregated(self, creq: ClientRequest, result: RequestResult) -> None:
        assert self._prefill is not None and self._decode is not None
        prefill = next(self._prefill)
        result.prefill_engine = prefill.engine_id
        final = None
        async for out in prefill.generate(
            self._engine_request(creq, 1, creq.arrival_s, {"do_remote_decode": True})
        ):
            if out.token_times_s:
                result.prefill_done_s = out.token_times_s[-1]
            final = out
        if final is None or final.finished_reason != "length" or not final.kv_transfer_params:
            result.finished_reason = final.finished_reason if final else "error"
            result.error = (final.error if final else None) or "prefill ended without KV to hand off"
            return
        await self._stream(
            next(self._decode),
            self._engine_request(creq, creq.max_tokens, result.prefill_done_s, final.kv_transfer_params),
            result,
        )

    @staticmethod
    def _engine_request(
        creq: ClientRequest, max_tokens: int, sent_s: float | None, params: dict | None
    ) -> EngineRequest:
        return EngineRequest(
            request_id=creq.request_id,
            prompt_token_ids=creq.prompt_token_ids,
            max_tokens=max_tokens,
            arrival_time_s=sent_s,
            forced_output_token_ids=creq.forced_output_token_ids,
            kv_transfer_params=params,
        )

    @staticmethod
    async def _stream(engine: EngineClient, ereq: EngineRequest, result: RequestResult) -> None:
        result.engine = engine.engine_id
        async for out in engine.generate(ereq):
            result.output_token_ids.extend(out.new_token_ids)
            result.token_times_s.extend(out.token_times_s)
            if out.finished_reason is None:
                continue
            result.finished_reason, result.error, result.times = out.finished_reason, out.error, out.times
