"""The step loop's clock: when the next step starts, and sleeping while there is nothing to run.

Steps run back to back: the next starts at the previous one's scheduled end, not when its sleep
returned, so wake-up jitter never accumulates into emulated time. An idle engine sleeps until it is
woken (a request arrived, blocks were freed, KV was loaded) or the first known event comes due, and
resumes at that event's emulated time::

    step ──── end ──── step ──── end      idle ............ wake-up (wall)
                                          ^ since           ^ resumes at the event's sim time
                                                              (not the wake-up's: a real hop between
                                                              actors must not shift emulated time)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from actors.engine.clock import Clock


class StepClock:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Something changed that may let the engine run (it re-schedules at its next boundary)."""
        self._wake.set()

    async def idle(self, since: float, upcoming: Callable[[float], list[float]]) -> float:
        """Sleep until woken or the first of `upcoming(since)` (emulated times of known events the
        schedule at `since` has not seen) comes due; returns the emulated time to resume at: the
        earliest event due by then, else now."""
        if not self._wake.is_set():
            times = upcoming(since)
            timeout = None
            if times:
                timeout = max(0.0, min(times) - self.clock.now()) * self.clock.time_scale
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
        self._wake.clear()
        now = self.clock.now()
        due = [t for t in upcoming(since) if t <= now]
        return max(since, min(due)) if due else now
