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
import time
from collections.abc import Callable

from actors.engine.clock import Clock

TIMER_RESOLUTION_S = time.get_clock_info("monotonic").resolution
"""How early asyncio may run a timer (its `_clock_resolution`), in loop seconds."""


def _nothing() -> None:
    pass


class StepClock:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._woken = False
        """Something changed since the engine last looked (it runs its next schedule before idling)."""
        self._idle: asyncio.Future[bool] | None = None
        """The idle engine's wait, which `wake` ends."""
        self._nap: asyncio.Future[bool] | None = None
        self._settle: Callable[[], None] = _nothing
        """What the nap under way calls when a `wake` ends it (`nap`'s `settle`)."""

    def wake(self) -> None:
        """Something is about to change that the engine's next step must see: every change from outside
        the step loop (a request, an abort, a push notice, freed blocks, a fault) calls this first. An
        idle engine re-schedules; a nap through a window of steps ends at once, its `settle` making the
        engine's state what the steps begun by now made it, so the change and whoever reads the state
        next meet the state a step at a time would have shown."""
        self._woken = True
        if self._idle is not None:
            _resolve(self._idle, True)
        if self._nap is not None:
            settle, self._settle = self._settle, _nothing
            settle()
            self.interrupt()

    async def nap(self, sim_t: float, settle: Callable[[], None]) -> bool:
        """Sleep until emulated `sim_t`; True if it came, False if a `wake` (which calls `settle` before
        it returns) or an `interrupt` came first."""
        if self.clock.skip_to(sim_t):  # nothing could come first
            return True
        loop = asyncio.get_running_loop()
        nap = self._nap = loop.create_future()
        self._settle = settle
        due = loop.call_later(max(0.0, sim_t - self.clock.now()) * self.clock.time_scale, _resolve, nap, True)
        try:
            return await nap
        finally:
            due.cancel()
            self._nap = None
            self._settle = _nothing

    def interrupt(self) -> None:
        """End a `nap` early (its `settle` not called: the napper settled)."""
        if self._nap is not None:
            _resolve(self._nap, False)

    async def idle(self, since: float, upcoming: Callable[[float], list[float]]) -> float:
        """Sleep until woken or the first of `upcoming(since)` (emulated times of known events the
        schedule at `since` has not seen) comes due; returns the emulated time to resume at: the
        earliest event due by then, else now."""
        if not self._woken:
            times = upcoming(since)
            loop = asyncio.get_running_loop()
            idle = self._idle = loop.create_future()
            timer = None
            if times:
                timeout = max(0.0, min(times) - self.clock.now()) * self.clock.time_scale
                timer = loop.call_later(timeout, _resolve, idle, False)
            try:
                await idle
            finally:
                if timer is not None:
                    timer.cancel()
                self._idle = None
        self._woken = False
        # asyncio runs a timer up to its clock's resolution early: an event that close is due (else
        # a virtual loop, whose time then does not move, would wake this engine forever).
        now = self.clock.now()
        due = [t for t in upcoming(since) if t <= now + TIMER_RESOLUTION_S / self.clock.time_scale]
        return max(since, min(due)) if due else now


def _resolve(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)
