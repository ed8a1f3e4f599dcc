"""Tasks an engine's rooms start in the background (a load, a notice, a call to the shared store)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Background:
    """Runs coroutines as tasks of the current loop, each kept until it ends (a task nobody refers to
    may be collected mid-way); their errors are dropped."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[None]] = set()

    def run(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
