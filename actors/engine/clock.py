"""The one clock: it turns emulated durations into waiting.

Roles compute emulated durations with pure functions and call `sleep_until(sim_t)`; nothing else
waits. Emulated time maps onto a time source as `source = origin + sim × time_scale`:
  - virtual: the loop's time on a `VirtualTimeLoop`, which jumps to the next event, so a run takes as
    long as its real work;
  - live: the head's monotonic time from an epoch shared by every actor of a run: each process reads
    its own `time.monotonic()` less its offset to the head's (`cluster.clock_sync`), so all of them,
    on any node, agree on emulated time; a deadline that has already passed when it is awaited is lag.
"""

from __future__ import annotations

import asyncio
import heapq
import selectors
import time
from collections.abc import Callable
from typing import Any


class Clock:
    def __init__(
        self,
        time_scale: float = 1.0,
        *,
        epoch_s: float | None = None,
        offset_s: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """Virtual (loop time from now) when `epoch_s` is None; live otherwise: the head's monotonic time
        (this process's `monotonic` less `offset_s`, its offset to the head's) from `epoch_s`."""
        self.time_scale = time_scale
        self._source: Callable[[], float]
        self._virtual: VirtualTimeLoop | None = None
        if epoch_s is None:
            loop = asyncio.get_running_loop()
            self._source = loop.time
            self._origin = self._source()
            self._virtual = loop if isinstance(loop, VirtualTimeLoop) else None
        else:
            self._source = (lambda: monotonic() - offset_s) if offset_s else monotonic
            self._origin = epoch_s

    def now(self) -> float:
        """Emulated seconds since the origin."""
        return self._sim(self._source())

    @property
    def virtual(self) -> bool:
        """Time jumps from event to event (a `VirtualTimeLoop`): the run's next events are known."""
        return self._virtual is not None

    def _sim(self, source_t: float) -> float:
        return (source_t - self._origin) / self.time_scale

    async def sleep_until(self, sim_t: float) -> float:
        """Wait until emulated time `sim_t`; returns how late the call already was (0 if on time).

        Callers stamp events with `sim_t`, not with `now()` afterwards.
        """
        delay = sim_t - self.now()
        if delay > 0:
            if not self._skip(delay):
                await asyncio.sleep(delay * self.time_scale)
            return 0.0
        return -delay

    def skip_to(self, sim_t: float) -> bool:
        """Move a virtual clock to `sim_t` (not earlier than now) at once, if nothing else could run
        first (`VirtualTimeLoop.skip`): then the caller need not wait."""
        return self._skip(max(0.0, sim_t - self.now()))

    def _skip(self, delay: float) -> bool:
        return self._virtual is not None and self._virtual.skip(delay * self.time_scale)


_MAX_TURN_S = 24 * 3600.0
"""asyncio's longest wait in one turn (`base_events.MAXIMUM_SELECT_TIMEOUT`): a longer sleep takes several."""


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


class _OrderedTimer(asyncio.TimerHandle):
    """A timer that, due at the same time as another, runs after the ones set before it. asyncio's
    heap compares due times only, so equal ones (a trace's whole-second arrivals) would run in an
    order that depends on every other timer in the heap, and a run with fewer timers elsewhere (decode
    windows) would route or schedule them differently."""

    seq = 0

    def __lt__(self, other: object) -> bool:
        """(Every timer of a `VirtualTimeLoop` is one: `call_at`.)"""
        assert isinstance(other, _OrderedTimer)
        when, other_when = self._when, other._when  # type: ignore[attr-defined]
        return bool(when < other_when or (when == other_when and self.seq < other.seq))


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose time is virtual: idle waits cost no wall time. Single process, no I/O.

    Events at the same virtual time run in the order they were scheduled, so a run is deterministic.
    """

    def __init__(self) -> None:
        self._virtual_now = 0.0
        self._num_timers = 0
        super().__init__(selector=_JumpSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def _asyncgen_firstiter_hook(self, agen: Any) -> None:
        """Keep no registry of async generators (asyncio's, a weak set, for `shutdown_asyncgens` to
        close those left open): a virtual run closes every stream it opens, and adding each request's
        half-dozen generators to it costs more than the rest of their start."""

    def call_at(  # type: ignore[override]  # asyncio's, with ties in order
        self, when: float, callback: Any, *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        self._check_closed()  # type: ignore[attr-defined]
        self._num_timers += 1
        timer = _OrderedTimer(when, callback, args, self, context)
        timer.seq = self._num_timers
        heapq.heappush(self._scheduled, timer)  # type: ignore[attr-defined]  # the loop's timer heap
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer

    def advance(self, seconds: float) -> None:
        self._virtual_now += max(0.0, seconds)

    def skip(self, delay: float) -> bool:
        """Move time on by `delay` at once, as the running callback's sleep of `delay` would, when
        nothing could run before that sleep ends: no callback is ready and no timer is due by then
        (one due at the same time was set first; one within the clock's resolution would run in the
        same turn). True if it moved (the caller need not sleep). The time is the one asyncio would
        reach (`advance` of the due time less now)."""
        when = self._virtual_now + delay
        timers = self._scheduled  # type: ignore[attr-defined]  # the loop's own timer heap
        if self._ready or delay > _MAX_TURN_S:  # type: ignore[attr-defined]  # its ready queue
            return False
        if timers and timers[0].when() < when + self._clock_resolution:  # type: ignore[attr-defined]
            return False
        self.advance(when - self._virtual_now)
        return True
