"""Client requests into the token-ID requests the engines get, one per role a request passes through.

Each engine sees the request from its arrival plus rendering and (E/P/D) encoding; decode gets only
its images' hashes (their KV comes from prefill), prefill and mixed engines what they encode or use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from actors.engine.clock import Clock
from messages import ClientRequest, EngineRequest, KVTransferParams, RenderSpec
from messages.token_ids import PromptIds


def for_decode(creq: ClientRequest) -> ClientRequest:
    """`creq` as decode needs it: its images' hashes only (decode gets their KV, never computes them)."""
    if not creq.mm_items:
        return creq
    items = [dataclasses.replace(m, pixel_values=None, embeds=None, encoded=True) for m in creq.mm_items]
    return dataclasses.replace(creq, mm_items=items)


def engine_arrival_s(creq: ClientRequest) -> float:
    """When an engine first sees `creq`: its arrival, plus rendering it and (E/P/D) encoding its images."""
    return creq.arrival_s + creq.render_s + creq.encode_s


def engine_request(
    creq: ClientRequest,
    prompt: PromptIds,
    max_tokens: int,
    sent_s: float | None,
    params: KVTransferParams | None,
) -> EngineRequest:
    """The token-ID request an engine gets for `creq`."""
    return EngineRequest(
        request_id=creq.request_id,
        prompt_token_ids=prompt,
        max_tokens=max_tokens,
        arrival_time_s=sent_s,
        forced_output_token_ids=creq.forced_output_token_ids,
        kv_transfer_params=params,
        stop_token_ids=creq.stop_token_ids,
        mm_items=creq.mm_items,
    )


async def decode_prompt(
    creq: ClientRequest,
    ids: PromptIds | None,
    render: Callable[[RenderSpec], Awaitable[list[int]]] | None,
    clock: Clock | None,
) -> tuple[PromptIds, float]:
    """The prompt decode computes: prefill's own token IDs (`ids`) when they can be reused, else rendered
    again by `render`, the proxy's renderer (a template that reads the clock may then render different
    tokens: see the tests); and the emulated seconds a re-render took (0 without a `clock`)."""
    if creq.render is None or render is None:
        return creq.prompt_token_ids, 0.0
    if creq.reuse_prompt_token_ids and ids is not None:
        return ids, 0.0
    if clock is None:
        return await render(creq.render), 0.0
    start = clock.now()
    prompt = await render(creq.render)
    return prompt, clock.now() - start
