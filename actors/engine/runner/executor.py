"""The executor: runs a step's batch on the runner model, or nothing with compute skip.

With compute skip there is no runner (torch never loads), no token is sampled and no KV exists; the
engine's bookkeeping and timing are the same either way.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from actors.engine.kv_cache.coordinator import KVCacheCoordinator
from actors.engine.request import Request
from actors.engine.scheduling.encoder_cache import EncoderCache
from actors.engine.scheduling.scheduled_batch import ScheduledBatch
from messages import MultiModalItem, SsmState

if TYPE_CHECKING:  # torch loads only where a runner computes (compute skip engines stay light)
    from actors.engine.runner.model_runner import ModelRunner, RunnerInput


class Executor:
    def __init__(
        self,
        runner: ModelRunner | None,
        kv_cache: KVCacheCoordinator,
        *,
        vocab_size: int,
        in_thread: bool = False,
        vision: Any = None,
    ) -> None:
        """`kv_cache`: the engine's, which says what each kind of KV gives a request's step (a hybrid's
        state blocks). `vocab_size`: token IDs the engine accepts; the loaded model's own when there is one.
        `in_thread` (live mode): run the forward pass off the event loop, so a decode engine's KV pull
        is served while this engine computes (torch releases the GIL). Not on a virtual loop, whose
        time would jump while the thread works. `vision`: the vision encoder (`vision_model`), with
        the runner."""
        self.runner = runner
        self.kv_cache = kv_cache
        self.vision = vision
        self.vocab_size = runner.vocab_size if runner is not None else vocab_size
        self.in_thread = in_thread
        self._stepping = False
        """A forward pass runs in its thread: it may still create or use any working copy."""
        self._deferred: list[str] = []
        """Requests released while it ran (aborted on the event loop): their working copies go after."""

    async def execute(self, batch: ScheduledBatch) -> list[int | None]:
        """The token sampled for each request of `batch` (None where it needs no logits, or skip)."""
        if self.runner is None:
            return [None] * len(batch.requests)
        items = runner_inputs(batch, self.kv_cache)  # read here: an abort changes them while it runs
        if not self.in_thread:
            return self.runner.execute(items)
        self._stepping = True
        try:
            return await asyncio.to_thread(self.runner.execute, items)
        finally:
            self._stepping = False
            for request_id in self._deferred:
                self.runner.release(request_id)
            self._deferred.clear()

    async def encode(self, inputs: list[tuple[Request, MultiModalItem]], cache: EncoderCache) -> None:
        """Encode a step's images with the vision encoder (compute skip: no embeddings, None); each
        goes to its request and the encoder cache."""
        if not inputs:
            return
        embeds = await encoded(self.vision, [item for _, item in inputs], self.in_thread)
        for (req, item), e in zip(inputs, embeds, strict=True):
            req.mm_embeds[item.mm_hash] = e
            cache.put(item.mm_hash, item.num_tokens, e)

    def release(self, request_id: str) -> None:
        """Drop a request's working KV (it finished or was preempted; its blocks stay in the pool); after
        the forward pass under way in its thread, which would otherwise make it again (an abort)."""
        if self._stepping:
            self._deferred.append(request_id)
        elif self.runner is not None:
            self.runner.release(request_id)

    def read_kv(self, block_ids: list[int], num_tokens: int) -> np.ndarray | None:
        return self.runner.read_kv(block_ids, num_tokens) if self.runner is not None else None

    def write_kv(self, block_ids: list[int], kv: np.ndarray | None) -> None:
        if self.runner is not None and kv is not None:
            self.runner.write_kv(block_ids, kv)

    def read_state(self, block: int | None) -> SsmState | None:
        """The recurrent state saved to `block` (`KVCacheCoordinator.state_block`; None: compute skip,
        or no such state)."""
        return self.runner.read_state(block) if self.runner is not None and block is not None else None

    def write_state(self, block: int | None, state: SsmState | None) -> None:
        if self.runner is not None and block is not None and state is not None:
            self.runner.write_state(block, state)

    def assert_empty(self) -> None:
        if self.runner is not None:
            self.runner.assert_empty()


def runner_inputs(batch: ScheduledBatch, kv_cache: KVCacheCoordinator) -> list[RunnerInput]:
    """What the runner computes for each request of `batch`: its new tokens, where its KV goes (and
    what each other kind of KV gives it: `KVCacheCoordinator.runner_fields`)."""
    from actors.engine.runner.model_runner import RunnerInput

    return [
        RunnerInput(
            request_id=req.request_id,
            token_ids=req.token_ids(req.num_computed_tokens, req.num_computed_tokens + n),
            start_pos=req.num_computed_tokens,
            block_ids=req.block_ids,
            capacity=req.num_prompt_tokens + req.max_tokens,
            needs_logits=req.num_computed_tokens + n == req.num_tokens,
            embeds=image_rows(req, req.num_computed_tokens, n),
            **kv_cache.runner_fields(req, n),
        )
        for req, n in zip(batch.requests, batch.num_new_tokens, strict=True)
    ]


async def encoded(vision: Any, items: list[MultiModalItem], in_thread: bool) -> list[np.ndarray | None]:
    """Each image's embeddings from the vision tower `vision` (None: compute skip, no embeddings), off
    the event loop when `in_thread` (a real-time clock). The tower loads torch, so only where it runs."""
    if vision is None:
        return [None] * len(items)
    from actors.engine.runner.vision import encode_images

    run = functools.partial(encode_images, vision, items)
    return list(await asyncio.to_thread(run) if in_thread else run())


def image_rows(req: Request, start: int, n: int) -> list[tuple[int, np.ndarray]]:
    """The embeddings of `req`'s images that fall in its tokens [start, start + n), as (position
    within those tokens, rows)::

        tokens      start ──────────────── start+n
        image            offset ─────────── offset+num_tokens
        rows             [start+i-offset for each i where the image and the chunk meet]
    """
    out = []
    for item in req.mm_items:
        lo, hi = max(start, item.offset), min(start + n, item.offset + item.num_tokens)
        embeds = req.mm_embeds.get(item.mm_hash)
        if lo < hi and embeds is not None:
            out.append((lo - start, embeds[lo - item.offset : hi - item.offset]))
    return out
