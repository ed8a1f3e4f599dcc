"""The one clock: it turns emulated durations into waiting.

Roles compute emulated durations with pure functions and call `sleep_until(sim_t)`; nothing else
waits. Emulated time maps onto a time source as `source = origin + sim × time_scale`:
  - virtual: the loop's time on a `VirtualTimeLoop`, which jumps to the next event, so a run takes as
    long as its real work;
  - live: wall time (`time.time()`) from an epoch shared by every actor of a run, so all of them, on
    any node, agree on emulated time; a deadline that has already passed when it is awaited is lag.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable
from typing import Any


class Clock:
    def __init__(self, time_scale: float = 1.0, epoch_s: float | None = None) -> None:
        """Virtual (loop time from now) when `epoch_s` is None; live (wall time from `epoch_s`) otherwise."""
        self.time_scale = time_scale
        self._source: Callable[[], float]
        if epoch_s is None:
            self._source = asyncio.get_running_loop().time
            self._origin = self._source()
        else:
            self._source, self._origin = time.time, epoch_s

    def now(self) -> float:
        """Emulated seconds since the origin."""
        return (self._source() - self._origin) / self.time_scale

    async def sleep_until(self, sim_t: float) -> float:
        """Wait until emulated time `sim_t`; returns how late the call already was (0 if on time).

        Callers stamp events with `sim_t`, not with `now()` afterwards.
        """
        delay = sim_t - self.now()
        if delay > 0:
            await asyncio.sleep(delay * self.time_scale)
            return 0.0
        return -delay


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
