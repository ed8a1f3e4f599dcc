"""The proxy: routes each client request through the engines and tells its story.

collocated:  client -> mixed engine i (chosen by the router: round robin, session affinity, on KV)
P/D, pull:   client -> prefill engine (max_tokens=1, do_remote_decode) -> first token + KV descriptor
                    -> decode engine (kv_transfer_params from prefill) -> pulls the KV -> stream
P/D, push:   client -> decode engine (reserves blocks) and prefill engine at once; prefill's descriptor
                    -> decode (`kv_ready`) -> the KV is pushed into the reserved blocks -> stream
The client's first token in P/D is decode's, as with vLLM's P/D proxies. Each pool has its router
(`actors.router`); in P/D a KV policy picks prefill by overlap and decode by load.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Protocol

from actors.encoding import EncoderPool
from actors.engine.clock import Clock
from actors.engine_pool import EngineClient, EnginePool, InProcessEngine
from actors.engine_requests import decode_prompt, engine_arrival_s, engine_request, for_decode
from actors.in_flight import InFlight
from actors.router import Router
from emulation.config import RouterConfig
from messages import ClientRequest, EngineOutput, EngineRequest, KVTransferParams, RenderSpec, RequestResult


class ProxyRecorder(Protocol):
    """Where the proxy records each finished request (`dashboards.recorders.ProxyMetrics`)."""

    def on_request_start(self, result: RequestResult) -> None: ...

    def on_request_done(self, result: RequestResult) -> None: ...

    def on_routed(self, pool: str, engine_id: str, overlap_blocks: int, prompt_blocks: int) -> None:
        """A pool's router chose `engine_id`, which held `overlap_blocks` of the prompt's blocks."""


class Proxy:
    def __init__(
        self,
        *,
        mixed: Sequence[EngineClient] = (),
        prefill: Sequence[EngineClient] = (),
        decode: Sequence[EngineClient] = (),
        recorder: ProxyRecorder | None = None,
        render: Callable[[RenderSpec], Awaitable[list[int]]] | None = None,
        push: bool = False,
        clock: Clock | None = None,
        router: RouterConfig | None = None,
        block_size: int = 16,
        bidirectional: bool = False,
        encoders: EncoderPool | None = None,
    ) -> None:
        """`recorder`: where finished requests are recorded (the client's view); None records nothing.
        `render`: renders a request again for decode when prefill's token IDs cannot be reused.
        `push` (kv_transfer.mode=push): decode gets each request first and prefill pushes into it.
        `clock`: the run's clock, to put a re-render for decode on the emulated path (None: free).
        `router`: how each pool picks its engine (None: round robin); `block_size`: the engines' (a KV
        router hashes prompts as they do). `bidirectional`: decode keeps each conversation's (session's)
        finished turn, and its next turn goes to that decode engine while prefill pulls back what it
        lacks of it. `encoders`: the encoder pool a request's images go to first (None: the engines
        encode them)."""
        self._encoders = encoders
        self.in_flight = InFlight()
        self._bidirectional = bidirectional
        self._conversations: dict[str, tuple[int, KVTransferParams]] = {}
        """session id -> (its decode engine, where that engine holds its last turn's blocks)"""
        self.recorder = recorder
        self.clock = clock
        self._render = render
        self._push = push
        if bool(mixed) == bool(prefill and decode):
            raise ValueError("a proxy needs mixed engines, or prefill and decode engines")
        cfg = router or RouterConfig()

        def now() -> float:  # the clock a live proxy joins later (`ProxyHost.join_clock`)
            return self.clock.now() if self.clock is not None else 0.0

        def time_scale() -> float:  # wall seconds per emulated second (what a prefill timeout waits)
            return self.clock.time_scale if self.clock is not None else 1.0

        def pool(name: str, engines: Sequence[EngineClient], policy: str | None = None) -> EnginePool | None:
            if not engines:
                return None

            def on_routed(i: int, overlap_blocks: int, prompt_blocks: int) -> None:
                if self.recorder is not None:
                    self.recorder.on_routed(name, engines[i].engine_id, overlap_blocks, prompt_blocks)

            router = Router(
                len(engines), cfg=cfg, block_size=block_size, now=now, policy=policy, on_routed=on_routed
            )
            return EnginePool(engines, router=router, cfg=cfg, time_scale=time_scale)

        self._mixed = pool("mixed", mixed)
        self._prefill = pool("prefill", prefill)
        self._decode = pool("decode", decode, cfg.policy_for("decode"))

    def kill(self, why: str) -> None:
        """Die and come back at once, as a supervisor restarts a crashed proxy (`faults.proxy_kills`): every
        request it is serving fails with `why`; its routers start over (KV index, sessions, dead
        engines: learnt again from events and health checks) and it forgets conversations."""
        self.in_flight.kill(why)
        self._conversations.clear()
        for pool in self.pools:
            pool.router.forget()

    @property
    def pools(self) -> list[EnginePool]:
        return [p for p in (self._mixed, self._prefill, self._decode) if p is not None]

    def listen_kv_events(self, engine: InProcessEngine) -> None:
        """Send an in-process engine's KV events straight to its pool's router, which brings them up
        to date (the engine's `listen_kv_events` says how) before it reads them."""
        ((pool, i),) = [(p, i) for p in self.pools for i, e in enumerate(p.engines) if e is engine]
        catch_up = engine.listen_kv_events(functools.partial(pool.router.on_kv_events, i))
        pool.router.before_read.append(catch_up)

    async def submit(self, creq: ClientRequest) -> RequestResult:
        """Serve one request to the end; failures are recorded in the result, never raised."""
        result = RequestResult.for_request(creq)
        async for _ in self.stream(creq, result):
            pass
        return result

    async def stream(self, creq: ClientRequest, result: RequestResult) -> AsyncGenerator[EngineOutput, None]:
        """Serve one request, yielding the client's token batches as they come (`result` records
        everything). Failures end the stream and are recorded, never raised; closing the stream early
        aborts the request ('abort')."""
        if self.recorder is not None:
            self.recorder.on_request_start(result)
        try:
            with self.in_flight.track(result):  # (a kill of this proxy fails it)
                if creq.mm_items and self._encoders is not None:
                    creq = await self._encoders.encode(creq)
                    result.encode_s = creq.encode_s
                    result.ec_transfer_s = creq.ec_transfer_s
                if self._mixed is not None:
                    arrival_s = engine_arrival_s(creq)
                    ereq = engine_request(creq, creq.prompt_token_ids, creq.max_tokens, arrival_s, None)
                    inner = self._stream(self._mixed, self._mixed.router.pick(creq), ereq, result)
                else:
                    inner = (self._decode_first if self._push else self._disaggregated)(creq, result)
                async with aclosing(inner):  # closing this stream closes the engine's: it aborts there
                    async for out in inner:
                        yield out
        except ValueError as e:  # an engine refused the request (its message, as vLLM's HTTP 400 has it)
            result.fail(str(e))
        except Exception as e:
            result.fail(f"{type(e).__name__}: {e}")
        finally:
            result.end_stream()
            if self.recorder is not None:
                self.recorder.on_request_done(result)

    async def _disaggregated(
        self, creq: ClientRequest, result: RequestResult
    ) -> AsyncGenerator[EngineOutput, None]:
        """Pull (vLLM's default): prefill first; decode gets prefill's kv_transfer_params and pulls."""
        assert self._prefill is not None and self._decode is not None
        sid = creq.session_id if self._bidirectional else None
        held = self._conversations.pop(sid, None) if sid is not None else None
        pull_back = dataclasses.replace(held[1], do_remote_prefill=True, pull_back=True) if held else None
        final = await self._prefill_step(self._prefill.router.pick(creq), creq, result, pull_back)
        if final is None:
            return
        # The prompt travels once, as the decode request's own token IDs; the params keep the descriptor.
        assert final.kv_transfer_params is not None
        params = dataclasses.replace(final.kv_transfer_params, prompt_token_ids=None)
        ids = final.kv_transfer_params.prompt_token_ids
        prompt, rerender_s = await decode_prompt(creq, ids, self._render, self.clock)
        prefill_done_s = result.prefill.prefill_done_s
        assert prefill_done_s is not None
        sent_s = prefill_done_s + rerender_s  # a re-render delays decode (the handoff's proxy hop)
        if sid is not None:  # decode keeps this turn's blocks for the next one
            params = dataclasses.replace(params, do_remote_decode=True)
        decode_req = engine_request(for_decode(creq), prompt, creq.max_tokens, sent_s, params)
        engine = self._decode.router.pick(creq, held[0] if held else None)
        try:
            async with aclosing(self._decode_turn(decode_req, result, sid, engine)) as outs:
                async for out in outs:
                    yield out
        except Exception:
            if held is None or result.token_times_s:
                raise
            # The conversation's decode engine is gone: another one takes the turn, pulling from prefill.
            engine = self._decode.router.pick(creq)
            async with aclosing(self._decode_turn(decode_req, result, sid, engine)) as outs:
                async for out in outs:
                    yield out

    async def _decode_turn(
        self, decode_req: EngineRequest, result: RequestResult, sid: str | None, engine: int
    ) -> AsyncGenerator[EngineOutput, None]:
        """Decode's part on `engine`; a conversation's (bidirectional) finished turn is remembered."""
        assert self._decode is not None
        async with aclosing(self._stream(self._decode, engine, decode_req, result)) as outs:
            async for out in outs:
                if sid is not None and out.finished_reason is not None and out.kv_transfer_params:
                    self._conversations[sid] = (engine, out.kv_transfer_params)
                yield out

    async def _decode_first(
        self, creq: ClientRequest, result: RequestResult
    ) -> AsyncGenerator[EngineOutput, None]:
        """Push: decode gets the request first and reserves blocks for it while prefill computes; then
        prefill's KV is pushed into those blocks (`kv_ready`), never before they exist."""
        assert self._prefill is not None and self._decode is not None
        decode_pool = self._decode
        p, d = self._prefill.router.pick(creq), decode_pool.router.pick(creq)
        decode = decode_pool.engines[d]
        params = KVTransferParams(
            do_remote_prefill=True,
            kv_push=True,
            remote_engine_id=self._prefill.engines[p].engine_id,
            remote_request_id=creq.request_id,
        )
        decode_req = engine_request(
            for_decode(creq), creq.prompt_token_ids, creq.max_tokens, engine_arrival_s(creq), params
        )
        outs: asyncio.Queue[EngineOutput | None] = asyncio.Queue()

        async def pump() -> None:  # decode's stream, opened now so that it reserves blocks
            try:
                async with aclosing(self._stream(decode_pool, d, decode_req, result)) as stream:
                    async for out in stream:
                        outs.put_nowait(out)
            finally:
                outs.put_nowait(None)

        task = asyncio.ensure_future(pump())
        try:
            final = await self._prefill_step(p, creq, result)
            if final is None:
                return
            assert final.kv_transfer_params is not None
            await decode.kv_ready(creq.request_id, final.kv_transfer_params)
            while (out := await outs.get()) is not None:
                yield out
            await task  # a failed decode stream raises here
        finally:
            if not task.done():  # prefill failed, or the client left: decode aborts
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _prefill_step(
        self, p: int, creq: ClientRequest, result: RequestResult, pull_back: KVTransferParams | None = None
    ) -> EngineOutput | None:
        """Run the prompt on prefill engine `p` (max_tokens=1, do_remote_decode; `pull_back`: where
        decode holds the conversation's last turn); its final output, or None with the failure
        recorded in `result`."""
        assert self._prefill is not None
        params = dataclasses.replace(pull_back or KVTransferParams(), do_remote_decode=True)
        ereq = engine_request(creq, creq.prompt_token_ids, 1, engine_arrival_s(creq), params)
        ereq.stop_token_ids = []  # prefill's token is only a by-product: decode samples the first one
        outs = await self._prefill.prefill_on_a_live_engine(p, creq, ereq, result.prefill)
        final = outs[-1] if outs else None
        if final is None or final.finished_reason != "length" or not final.kv_transfer_params:
            result.finished_reason = final.finished_reason if final else "error"
            result.error = (final.error if final else None) or "prefill ended without KV to hand off"
            result.rejected_by = final.rejected_by if final else None
            result.times = result.prefill.prefill_times  # where it ended
            return None
        return final

    async def _stream(
        self, pool: EnginePool, i: int, ereq: EngineRequest, result: RequestResult
    ) -> AsyncGenerator[EngineOutput, None]:
        result.engine = pool.engines[i].engine_id
        async with aclosing(pool.outputs(i, ereq)) as outs:
            async for out in outs:
                result.output_token_ids.extend(out.new_token_ids)
                result.token_times_s.extend(out.token_times_s)
                if out.finished_reason is not None:
                    result.finished_reason = out.finished_reason
                    result.error = out.error
                    result.rejected_by = out.rejected_by
                    result.times = out.times
                yield out
