"""The executor: runs a step's batch on the runner model, or nothing with compute skip.

With compute skip there is no runner (torch never loads), no token is sampled and no KV exists; the
engine's bookkeeping and timing are the same either way.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import numpy as np

from actors.engine.scheduler import ScheduledBatch

if TYPE_CHECKING:  # torch loads only where a runner computes (compute skip engines stay light)
    from actors.engine.runner import ModelRunner


class Executor:
    def __init__(self, runner: ModelRunner | None, vocab_size: int, in_thread: bool = False) -> None:
        """`vocab_size`: token IDs the engine accepts; the loaded model's own when there is one.
        `in_thread` (live mode): run the forward pass off the event loop, so a decode engine's KV pull
        is served while this engine computes (torch releases the GIL). Not on a virtual loop, whose
        time would jump while the thread works."""
        self.runner = runner
        self.vocab_size = runner.vocab_size if runner is not None else vocab_size
        self.in_thread = in_thread

    async def execute(self, batch: ScheduledBatch) -> list[int | None]:
        """The token sampled for each request of `batch` (None where it needs no logits, or skip)."""
        if self.runner is None:
            return [None] * len(batch.requests)
        if self.in_thread:
            return await asyncio.to_thread(self._execute, self.runner, batch)
        return self._execute(self.runner, batch)

    @staticmethod
    def _execute(runner: ModelRunner, batch: ScheduledBatch) -> list[int | None]:
        from actors.engine.runner import RunnerInput

        items = [
            RunnerInput(
                request_id=req.request_id,
                token_ids=req.token_ids(req.num_computed_tokens, req.num_computed_tokens + n),
                start_pos=req.num_computed_tokens,
                block_ids=req.block_ids,
                capacity=req.num_prompt_tokens + req.max_tokens,
                needs_logits=req.num_computed_tokens + n == req.num_tokens,
            )
            for req, n in zip(batch.requests, batch.num_new_tokens, strict=True)
        ]
        return runner.execute(items)

    def release(self, request_id: str) -> None:
        """Drop a request's working KV (it finished or was preempted; its blocks stay in the pool)."""
        if self.runner is not None:
            self.runner.release(request_id)

    def read_kv(self, block_ids: list[int], num_tokens: int) -> np.ndarray | None:
        return self.runner.read_kv(block_ids, num_tokens) if self.runner is not None else None

    def write_kv(self, block_ids: list[int], kv: np.ndarray | None) -> None:
        if self.runner is not None and kv is not None:
            self.runner.write_kv(block_ids, kv)

    def assert_empty(self) -> None:
        if self.runner is not None:
            self.runner.assert_empty()
