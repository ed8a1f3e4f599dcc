"""An engine's admission limits: which requests it refuses, when, and why.

An engine is one vLLM instance, and vLLM 0.32's API server has two queue limits (`AsyncLLM.
check_admission`, before a request reaches its engine), which the testbed enforces where a request
reaches the engine:

  - `scheduler.max_num_queued_reqs`: the requests in flight (waiting, running or loading remote KV;
    a request with `n` > 1 counts `n`, the testbed's `n` is 1) plus the new one's `n` may not exceed
    it;
  - `scheduler.max_num_queued_tokens`: a request is refused while the prompt tokens of the requests
    still in prefill (in flight, no output token yet: vLLM's `is_prefilling`) reach it; each counts its
    whole prompt, however much is computed or cached.

Both are seen as vLLM's API server sees them, at the new request's arrival in emulated time: a request
is in flight from its arrival until its final output arrives (the end of its last step, though the
scheduler let it go when the step was computed), and in prefill until its first token arrives.

vLLM answers both with a 503 and counts them in `vllm:admission_rejections{reason}`. It checks before
rendering a request and again as it adds it to its engine; an engine here gets token IDs (the render
tier rendered them), so one check stands for both. In front of the
engine, the testbed can also shed load as a gateway would (no vLLM counterpart; a 429 with
Retry-After):

  - `scheduler.max_waiting`: a request arriving while that many wait to be scheduled is refused at
    once (counted under `reason="max_waiting"`); checked first, so vLLM's limits never see it;
  - `scheduler.max_queue_time_s`: a request still waiting for its first step that long after it was
    queued is refused then (`expired`); a request whose remote KV is loading, or that ran and was
    preempted, has started and is never refused.

Each ends the request as `rejected`, nothing computed, with the limit's name (`Refusal.limit`).
"""

from __future__ import annotations

from dataclasses import dataclass

from actors.engine.request import Request, RequestStatus
from actors.engine.scheduling.scheduler import Scheduler

VLLM_QUEUE_LIMITS = ("max_num_queued_reqs", "max_num_queued_tokens")
"""vLLM's two limits (their `vllm:admission_rejections` reasons): a 503 behind the server."""
FINISHED_KEPT_S = 1.0
"""How long (emulated) a finished request is kept for `Admission.in_flight` after it ended: arrivals are
not asked about in order of their times (a longer prompt takes longer to render), only nearly."""


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: the `scheduler.` field of the limit, and a sentence for its record."""

    limit: str
    why: str


def vllm_queue_limit(
    num_reqs: int,
    num_prefill_tokens: int,
    *,
    max_num_queued_reqs: int | None,
    max_num_queued_tokens: int | None,
    n: int = 1,
) -> str | None:
    """vLLM 0.32's admission rule: the limit that refuses a request of `n` sequences arriving while
    `num_reqs` are in flight and `num_prefill_tokens` prompt tokens are in prefill (None: admitted).
    The requests' limit is checked first; it refuses when `num_reqs + n > max`, the tokens' when
    `num_prefill_tokens >= max` (whatever the new prompt's length)."""
    if max_num_queued_reqs is not None and num_reqs + n > max_num_queued_reqs:
        return "max_num_queued_reqs"
    if max_num_queued_tokens is not None and num_prefill_tokens >= max_num_queued_tokens:
        return "max_num_queued_tokens"
    return None


class Admission:
    """One engine's limits (None: off) over its scheduler's requests; `finished` is told of each request
    that ends, `refusal` asked at each arrival, `expired` and `next_deadline` at each step."""

    def __init__(
        self,
        engine_id: str,
        *,
        scheduler: Scheduler,
        max_waiting: int | None = None,
        max_queue_time_s: float | None = None,
        max_num_queued_reqs: int | None = None,
        max_num_queued_tokens: int | None = None,
    ) -> None:
        self.engine_id = engine_id
        self.scheduler = scheduler
        self.max_waiting = max_waiting
        self.max_queue_time_s = max_queue_time_s
        self.max_num_queued_reqs = max_num_queued_reqs
        self.max_num_queued_tokens = max_num_queued_tokens
        self._vllm_limits = max_num_queued_reqs is not None or max_num_queued_tokens is not None
        self._finishing: list[Request] = []
        """Requests the scheduler let go whose output is still to arrive (`finished`)."""

    def refusal(self, now: float) -> Refusal | None:
        """Why a request arriving at `now` is refused (None: it is admitted): the gateway's
        `max_waiting` first, then vLLM's limits (`vllm_queue_limit`) over the requests in flight."""
        num_waiting = len(self.scheduler.waiting)
        if self.max_waiting is not None and num_waiting >= self.max_waiting:
            return self._refusal("max_waiting", f"{num_waiting} requests waiting")
        if not self._vllm_limits:
            return None
        in_flight = self.in_flight(now)
        num_reqs = len(in_flight)
        num_tokens = sum(r.num_prompt_tokens for r in in_flight if _prefilling(r, now))
        limit = vllm_queue_limit(
            num_reqs,
            num_tokens,
            max_num_queued_reqs=self.max_num_queued_reqs,
            max_num_queued_tokens=self.max_num_queued_tokens,
        )
        if limit == "max_num_queued_reqs":
            return self._refusal(limit, f"{num_reqs} requests in flight")
        if limit == "max_num_queued_tokens":
            return self._refusal(limit, f"{num_tokens} prompt tokens in prefill")
        return None

    def in_flight(self, now: float) -> list[Request]:
        """The requests vLLM's API server holds at `now`: queued by then, and not finished by then (the
        scheduler lets a request go when its last step is computed; the API server when that step's
        output arrives, at its end)."""
        self._finishing = [r for r in self._finishing if _finished_after(r, now - FINISHED_KEPT_S)]
        finishing = [r for r in self._finishing if _finished_after(r, now)]
        s = self.scheduler
        held = (*s.waiting, *s.running, *s.recving.values(), *finishing)
        return [r for r in held if r.times.queued_s <= now]

    def finished(self, req: Request) -> None:
        """`req` ended (`times.finished_s` set): in flight until then (`in_flight`)."""
        if self._vllm_limits:
            self._finishing.append(req)

    def _refusal(self, limit: str, state: str) -> Refusal:
        return Refusal(limit, f"engine {self.engine_id}: {state} (scheduler.{limit})")

    def expired(self, now: float) -> list[tuple[Request, Refusal]]:
        """Requests that have not started and were queued `max_queue_time_s` or more before `now`, each
        with why it is refused."""
        budget = self.max_queue_time_s
        if budget is None:
            return []
        out = []
        for req in self._not_started():  # (in order of queueing: the first within budget ends it)
            if req.times.queued_s + budget > now:
                break
            waited = f"waited {now - req.times.queued_s:.3g} s without starting"
            out.append((req, self._refusal("max_queue_time_s", waited)))
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


def _prefilling(req: Request, now: float) -> bool:
    """vLLM's `is_prefilling` at `now`: no output token has arrived yet (a preempted request that had one
    is not in prefill again, as in vLLM)."""
    first = req.times.first_token_s
    return first is None or first > now


def _finished_after(req: Request, now: float) -> bool:
    finished = req.times.finished_s
    return finished is None or finished > now
