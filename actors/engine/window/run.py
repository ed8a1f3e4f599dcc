"""An engine's windows (`window`): planning one at a step, sleeping through it, committing it, and
ending it early when something from outside reaches the engine."""

from __future__ import annotations

import math
from collections.abc import Callable

from actors.engine.clock import Clock
from actors.engine.request import Request
from actors.engine.scheduling.scheduled_batch import ScheduledBatch
from actors.engine.scheduling.scheduler import Scheduler
from actors.engine.stats import EngineStats
from actors.engine.step_clock import StepClock
from actors.engine.streams import OutputStreams
from actors.engine.window.plan import Window, plan_window
from emulation.time_model import StepTimeModel
from messages import FinishedReason
from messages.stats import NO_WORK


class Windows:
    """An engine's windows: planning one, running it, ending it early. Its collaborators are
    the engine's; `finish` ends a request as the engine does."""

    def __init__(
        self,
        *,
        clock: Clock,
        step_clock: StepClock,
        scheduler: Scheduler,
        time_model: StepTimeModel,
        stats: EngineStats,
        streams: OutputStreams,
        finish: Callable[[Request, FinishedReason, float], None],
        allowed: bool = True,
    ) -> None:
        """`allowed`: plan windows at all (virtual clock, compute skip, `runner.macro_steps`)."""
        self.allowed = allowed
        self.clock = clock
        self.step_clock = step_clock
        self.scheduler = scheduler
        self.time_model = time_model
        self.stats = stats
        self.streams = streams
        self.finish = finish
        # KV events on outputs: a router reads them as the steps go (each output wakes its client), so
        # steps go one at a time, unless the router reads them in process (`read_in_process`).
        self.enabled = allowed and not scheduler.blocks.publishes_kv_events
        streams.wake_on_tokens = not self.enabled
        self._window: Window | None = None
        """The window under way, until its steps are committed."""

    def read_in_process(self) -> Callable[[], None]:
        """A router in process takes the engine's KV events as outputs leave: windows may run, and
        what the router calls before it reads the events ends the one under way after the steps begun
        by now (`settle`), whose outputs, and so events, a step at a time would have handed over."""
        self.enabled = self.allowed
        self.streams.wake_on_tokens = not self.enabled
        return self.settle

    def plan(
        self, batch: ScheduledBatch, start: float, upcoming: Callable[[float], list[float]]
    ) -> Window | None:
        """The window starting with `batch` at `start`, before the engine's `upcoming(start)` events."""
        if not self.enabled or not self.scheduler.steady(batch, start):  # (before the horizon's work)
            return None
        horizon = min(upcoming(start), default=math.inf)
        return plan_window(batch, self.scheduler, self.time_model, start, horizon)

    async def run(self, window: Window) -> float:
        """Sleep to the window's last step (unless it is cut short), commit its steps, sleep to their
        end; the end."""
        self._window = window
        if await self.step_clock.nap(window.last_start, self.settle):
            self._commit(window)
        self._window = None
        await self.clock.sleep_until(window.end)
        k = window.num_steps
        work = window.work() if self.stats.reads_work else NO_WORK
        self.stats.on_steps(
            window.step_s[:k], window.num_scheduled_tokens, window.cpu_s[:k], work, window.measured_s[:k]
        )
        self.stats.on_state(self.scheduler)
        return window.end

    def settle(self) -> None:
        """End the window under way with the steps begun by now (a step at a time, a change from
        outside would reach the next step; a reader of the engine's state sees what those steps did).
        Its nap's `settle`: every change from outside wakes the step loop first (`StepClock.wake`)."""
        window = self._window
        if window is not None and not window.committed:
            window.cut_before(math.nextafter(self.clock.now(), math.inf))
            self._commit(window)
            self.step_clock.interrupt()

    def _commit(self, window: Window) -> None:
        """Apply its steps to its requests (`Scheduler.update_from_steps`) and hand out their tokens."""
        assert not window.committed
        window.committed = True
        k = window.num_steps
        emitted = self.scheduler.update_from_steps(
            window.batch, window.chunks, window.starts[0], window.step_s[:k], window.ends[:k]
        )
        self.stats.on_window_tokens([(req, stamps) for req, _, stamps, _ in emitted])
        for req, tokens, stamps, stop in emitted:
            self.streams.push_many(req.request_id, tokens, stamps)
            if stop is not None:
                self.finish(req, stop, window.end)
