"""The one clock: it turns emulated durations into waiting.

Roles compute emulated durations with pure functions and call `sleep_until(sim_t)`; nothing else
waits. The clock maps emulated time onto the asyncio loop's time, `loop = origin + sim × time_scale`:
on a `VirtualTimeLoop` the loop's time jumps to the next event, so a run takes as long as its real
work; on an ordinary loop it is wall time (live mode), and a wake-up later than planned is lag.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class Clock:
    def __init__(self, time_scale: float = 1.0, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self.time_scale = time_scale
        self._origin = self._loop.time()
        self.num_late_wakeups = 0
        self.max_overrun_s = 0.0
        """Worst lateness of a wake-up against its emulated schedule, in emulated seconds."""

    def now(self) -> float:
        """Emulated seconds since the clock started."""
        return (self._loop.time() - self._origin) / self.time_scale

    async def sleep_until(self, sim_t: float) -> None:
        """Wait until emulated time `sim_t`; callers stamp events with `sim_t`, not with `now()` after."""
        delay = sim_t - self.now()
        if delay > 0:
            await asyncio.sleep(delay * self.time_scale)
        elif delay < -1e-9:
            self.num_late_wakeups += 1
            self.max_overrun_s = max(self.max_overrun_s, -delay)


class DeadlockError(RuntimeError):
    """Virtual time found nothing to run and nothing scheduled: something waits for an event nobody sets."""


class _JumpSelector(selectors.BaseSelector):
    """A selector that never blocks: asking it to wait `timeout` seconds moves virtual time instead."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop
        self._map: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._map[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._map.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise DeadlockError("virtual time: no callback is ready and no timer is set")
        self._loop.advance(timeout)
        return []

    def get_map(self) -> Any:
        return self._map

    def close(self) -> None:
        self._map.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose time is virtual: idle waits cost no wall time. Single process, no I/O.

    Events at the same virtual time run in the order they were scheduled, so a run is deterministic.
    """

    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(selector=_JumpSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += max(0.0, seconds)
