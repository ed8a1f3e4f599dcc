"""The proxy's encoder pool (E/P/D): a request's images encoded before prefill sees it.

As vLLM's disaggregated-encoder proxy does: one encoder job per distinct image, all awaited, then the
request goes on carrying the embeddings (what vLLM's EC connector moves to prefill). Text-only
requests skip the pool. An image always goes to the same encoder (by its hash), so a repeated image
hits that encoder's cache and costs no encoder time; its embeddings still move::

    arrival ─ render ─┬─ queue + encode image 1 (encoder 0) ─ EC transfer ─┐
                      └─ queue + encode image 2 (encoder 1) ─ EC transfer ─┴─ prefill sees it

The EC transfer is the link model's time for visual tokens x the target LM's width x 2 bytes
(`emulation.vision`), from when the encoder had the embeddings.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Protocol

from emulation.profiles import LinkProfile
from emulation.transfer import handoff_time
from messages import ClientRequest, EncodedImage, EncodeJob, MultiModalItem


class EncoderClient(Protocol):
    async def encode(self, job: EncodeJob) -> EncodedImage: ...


class EncoderPool:
    def __init__(
        self, encoders: Sequence[EncoderClient], link: LinkProfile, embedding_bytes_per_token: int
    ) -> None:
        self.encoders = list(encoders)
        self.link = link
        self.embedding_bytes_per_token = embedding_bytes_per_token

    def encoder_for(self, item: MultiModalItem) -> EncoderClient:
        return self.encoders[int(item.mm_hash[:8], 16) % len(self.encoders)]

    async def encode(self, creq: ClientRequest) -> ClientRequest:
        """`creq` with every image's embeddings on board (pixels dropped), `encode_s` set (from
        rendered to the last embedding landing on prefill) and `ec_transfer_s` (that image's transfer)."""
        rendered_s = creq.arrival_s + creq.render_s
        unique = {item.mm_hash: item for item in creq.mm_items}
        jobs = [EncodeJob(creq.request_id, item, rendered_s) for item in unique.values()]
        done = await asyncio.gather(*(self.encoder_for(job.item).encode(job) for job in jobs))
        by_hash = {d.mm_hash: d for d in done}
        landed_s, ec_s = rendered_s, 0.0
        for job, d in zip(jobs, done, strict=True):
            nbytes = job.item.num_tokens * self.embedding_bytes_per_token
            xfer_s = handoff_time(nbytes, 1, self.link).total_s
            if d.done_s + xfer_s > landed_s:
                landed_s, ec_s = d.done_s + xfer_s, xfer_s
        items = [
            dataclasses.replace(item, pixel_values=None, encoded=True, embeds=by_hash[item.mm_hash].embeds)
            for item in creq.mm_items
        ]
        return dataclasses.replace(creq, mm_items=items, encode_s=landed_s - rendered_s, ec_transfer_s=ec_s)
