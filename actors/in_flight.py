"""The requests a proxy is serving, by the task serving each: what its death fails (`faults.proxy_kills`).

A kill marks each request failed and cancels its task; the cancellation unwinds the request's streams
(the engines abort it) and is swallowed where the request is tracked, so its caller gets the failed
result, as a client gets an error when the proxy it talks to dies, not a cancelled call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from messages import RequestResult


class InFlight:
    def __init__(self) -> None:
        self._serving: dict[asyncio.Task[object], RequestResult] = {}
        self._killed: set[asyncio.Task[object]] = set()

    @contextlib.contextmanager
    def track(self, result: RequestResult) -> Iterator[None]:
        """Serve `result`'s request in the current task; a `kill` ends the block early (suppressed)."""
        task = asyncio.current_task()
        assert task is not None
        self._serving[task] = result
        try:
            yield
        except asyncio.CancelledError:
            if task not in self._killed:
                raise
            task.uncancel()  # the kill's cancel, not the caller's: it ends here
        finally:
            self._killed.discard(task)
            self._serving.pop(task, None)

    def kill(self, why: str) -> int:
        """Fail every request being served with `why`; how many there were."""
        for task, result in self._serving.items():
            result.finished_reason, result.error = "error", why
            self._killed.add(task)
            task.cancel()
        return len(self._serving)
