"""Client requests into the token-ID requests the engines get, one per role a request passes through.

Each engine sees the request from its arrival plus rendering and (E/P/D) encoding; decode gets only
its images' hashes (their KV comes from prefill), prefill and mixed engines what they encode or use.
"""

from __future__ import annotations

import dataclasses

from messages import ClientRequest, EngineRequest, KVTransferParams
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
