"""An encoder engine: images in, embeddings out, in steps timed by the target's vision encoder.

The same step-loop shape as the LM engines (`EngineCore`): jobs queue from their arrival time; each
step takes the oldest jobs whose visual tokens fit `max_num_batched_encoder_embeds` (at least one, as
vLLM floors the budget at the largest item), encodes them for real with the tiny vision tower, and
lasts the target encoder's roofline time plus the step overhead; every embedding of the step is
ready at its end. Embeddings stay in the encoder's cache (the EC producer's storage, keyed by
`mm_hash`): an image encoded before comes back at once, at no encoder time, and one being encoded
for another request is waited for, not encoded twice::

    jobs     a(256) b(1225) c(256)          budget 2048
    step 1   [a b]  ─ t(a) + t(b) ─┐        c waits: it does not fit after a and b
    step 2                         [c] ─┐
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from typing import Any, Protocol

from actors.engine.clock import Clock
from actors.engine.runner.executor import encoded
from actors.engine.scheduling.encoder_cache import EncoderCache
from actors.engine.step_clock import StepClock
from emulation.vision import EncoderRoofline
from messages import EncodedImage, EncodeJob
from messages.stats import EncoderStats


class EncoderRecorder(Protocol):
    """Where an encoder records (dashboards.recorders.EncoderMetrics)."""

    def on_encoder_step(self, num_visual_tokens: int, stats: EncoderStats) -> None:
        """A step of `num_visual_tokens`; `stats`: the encoder's totals after it."""

    def on_encoder_state(self, num_waiting: int) -> None: ...

    def on_encoder_lookup(self, stats: EncoderStats) -> None:
        """A job's image looked up in the encoder's cache; `stats`: the totals after it."""


class EncoderCore:
    def __init__(
        self,
        encoder_id: str,
        *,
        clock: Clock,
        roofline: EncoderRoofline,
        vision: Any,
        max_num_batched_encoder_embeds: int,
        cache: EncoderCache,
        step_overhead_s: float = 0.0,
        in_thread: bool = False,
        recorder: EncoderRecorder | None = None,
    ) -> None:
        """`vision`: the tiny vision tower (None: compute skip, no embeddings); `in_thread`: compute off
        the event loop (a real-time clock); `recorder`: its series (None records nothing)."""
        self.encoder_id = encoder_id
        self.clock = clock
        self.roofline = roofline
        self.vision = vision
        self.budget = max_num_batched_encoder_embeds
        self.cache = cache
        self.step_overhead_s = step_overhead_s
        self.in_thread = in_thread
        self.recorder = recorder
        self.step_clock = StepClock(clock)
        self._queue: deque[tuple[EncodeJob, asyncio.Future[EncodedImage]]] = deque()
        self._pending: dict[str, asyncio.Future[EncodedImage]] = {}
        """Images queued or being encoded, by hash (a second job for one waits for the first)."""
        self._loop_task: asyncio.Future[None] | None = None
        self._stopped = False
        self.num_steps = 0
        self.num_encoded = 0
        self.busy_s = 0.0

    async def encode(self, job: EncodeJob) -> EncodedImage:
        """`job`'s image encoded (or found in the cache, ready when the job arrives)."""
        hit, embeds = self.cache.lookup(job.item.mm_hash)
        if self.recorder is not None:
            self.recorder.on_encoder_lookup(self.stats())
        if hit:
            return EncodedImage(job.item.mm_hash, embeds, job.arrival_s, cached=True)
        pending = self._pending.get(job.item.mm_hash)
        if pending is not None:  # the same image is being encoded for another request: once is enough
            first = await asyncio.shield(pending)
            return dataclasses.replace(first, done_s=max(first.done_s, job.arrival_s), cached=True)
        done: asyncio.Future[EncodedImage] = asyncio.get_running_loop().create_future()
        self._pending[job.item.mm_hash] = done
        self._queue.append((job, done))
        self._record_state()
        self.step_clock.wake()
        try:
            return await asyncio.shield(done)  # a cancelled caller must not cancel the others' wait
        finally:
            self._pending.pop(job.item.mm_hash, None)

    def stats(self) -> EncoderStats:
        """Its totals so far (what its series and the run's encoder summary read)."""
        return EncoderStats(self.num_steps, self.busy_s, self.cache.num_queries, self.cache.num_hits)

    def start(self) -> None:
        self._loop_task = asyncio.ensure_future(self._run())

    async def drain(self) -> None:
        self._stopped = True
        self.step_clock.wake()
        if self._loop_task is not None:
            await self._loop_task

    def assert_empty(self) -> None:
        assert not self._queue, f"{self.encoder_id}: jobs left: {[j.request_id for j, _ in self._queue]}"

    async def _run(self) -> None:
        """The step loop; if it breaks, every job waiting fails with the error."""
        try:
            await self._step_loop()
        except Exception as e:
            for _, done in self._queue:
                if not done.done():
                    done.set_exception(RuntimeError(f"encoder {self.encoder_id} crashed: {e!r}"))
            self._queue.clear()
            raise

    async def _step_loop(self) -> None:
        scheduled: float | None = None
        while not self._stopped:
            now = self.clock.now() if scheduled is None else scheduled
            batch = self._take(now)
            if not batch:
                scheduled = await self.step_clock.idle(now, self._upcoming)
                continue
            scheduled = await self._step(batch, now)

    def _take(self, now: float) -> list[tuple[EncodeJob, asyncio.Future[EncodedImage]]]:
        """The oldest arrived jobs whose visual tokens fit the budget (the first one always does)."""
        batch: list[tuple[EncodeJob, asyncio.Future[EncodedImage]]] = []
        budget = self.budget
        while self._queue and self._queue[0][0].arrival_s <= now:
            job = self._queue[0][0]
            if batch and job.item.num_tokens > budget:
                break
            budget -= job.item.num_tokens
            batch.append(self._queue.popleft())
        return batch

    def _upcoming(self, since: float) -> list[float]:
        return [job.arrival_s for job, _ in self._queue if job.arrival_s > since]

    async def _step(self, batch: list[tuple[EncodeJob, asyncio.Future[EncodedImage]]], start: float) -> float:
        embeds = await encoded(self.vision, [job.item for job, _ in batch], self.in_thread)
        step = self.roofline.visual_tokens_time(job.item.num_tokens for job, _ in batch)
        end = start + step.total_s + self.step_overhead_s
        await self.clock.sleep_until(end)
        for (job, done), e in zip(batch, embeds, strict=True):
            self.cache.put(job.item.mm_hash, job.item.num_tokens, e)
            if not done.done():  # its request may have been cancelled meanwhile
                done.set_result(EncodedImage(job.item.mm_hash, e, end, cached=False))
        self.num_steps += 1
        self.num_encoded += len(batch)
        self.busy_s += end - start
        if self.recorder is not None:
            self.recorder.on_encoder_step(sum(job.item.num_tokens for job, _ in batch), self.stats())
        self._record_state()
        return end

    def _record_state(self) -> None:
        if self.recorder is not None:
            self.recorder.on_encoder_state(len(self._queue))
