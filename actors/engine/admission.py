"""An engine's admission limits: which requests it refuses, when, and why (vLLM has none: its queue
grows without bound, and every request waits its turn).

  - `scheduler.max_waiting`: a request arriving while that many wait to be scheduled is refused at
    once, nothing computed (`refusal`);
  - `scheduler.max_queue_time_s`: a request still waiting for its first step that long after it was
    queued is refused then (`expired`); a request whose remote KV is loading, or that ran and was
    preempted, has started and is never refused.

Both end the request as `rejected` (HTTP 429 with Retry-After behind the server).
"""

from __future__ import annotations

from actors.engine.request import Request, RequestStatus
from actors.engine.scheduler import Scheduler


class Admission:
    def __init__(
        self,
        engine_id: str,
        *,
        scheduler: Scheduler,
        max_waiting: int | None,
        max_queue_time_s: float | None,
    ) -> None:
        self.engine_id = engine_id
        self.scheduler = scheduler
        self.max_waiting = max_waiting
        self.max_queue_time_s = max_queue_time_s

    def refusal(self) -> str | None:
        """Why a request arriving now is refused (None: it is admitted)."""
        num_waiting = len(self.scheduler.waiting)
        if self.max_waiting is not None and num_waiting >= self.max_waiting:
            return f"engine {self.engine_id}: {num_waiting} requests waiting (scheduler.max_waiting)"
        return None

    def expired(self, now: float) -> list[tuple[Request, str]]:
        """Requests that have not started and were queued `max_queue_time_s` or more before `now`, each
        with why it is refused."""
        budget = self.max_queue_time_s
        if budget is None:
            return []
        out = []
        for req in self._not_started():  # (in order of queueing: the first within budget ends it)
            if req.times.queued_s + budget > now:
                break
            why = f"waited {now - req.times.queued_s:.3g} s without starting (scheduler.max_queue_time_s)"
            out.append((req, f"engine {self.engine_id}: {why}"))
        return out

    def next_deadline(self, since: float) -> list[float]:
        """When the next request not started runs out of budget, if after `since` (an event the engine
        must wake for even when idle: its blocks may be held for a pull)."""
        if self.max_queue_time_s is None:
            return []
        for req in self._not_started():
            deadline = req.times.queued_s + self.max_queue_time_s
            if deadline > since:
                return [deadline]
        return []

    def _not_started(self) -> list[Request]:
        """Waiting requests never scheduled (the scheduler queues them in order of `queued_s`; preempted
        ones go back to the front)."""
        return [r for r in self.scheduler.waiting if r.status is RequestStatus.WAITING]
