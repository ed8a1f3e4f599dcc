"""The render tier as a replayed run sees it: a cost model, since a trace holds token IDs already.

`render.replicas` CPU workers each render one request at a time, first come first served on the replica
free soonest, for `s_per_call + s_per_prompt_token x prompt tokens` seconds (fitted to the project's own
render tier by `bench/render_cost.py`)::

    arrival ─ wait (every replica busy) ─ render ─ done        render_s = done - arrival

Behind `testbed serve` nothing is modelled: every render is timed on the run's clock.
"""

from __future__ import annotations

import heapq

from target.config import RenderConfig


class RenderTier:
    def __init__(self, cfg: RenderConfig) -> None:
        self.cfg = cfg
        self._free_s = [0.0] * cfg.replicas  # when each replica is next free (a heap)

    def cost_s(self, num_prompt_tokens: int) -> float:
        """One render's CPU seconds."""
        return self.cfg.s_per_call + self.cfg.s_per_prompt_token * num_prompt_tokens

    def render_s(self, arrival_s: float, num_prompt_tokens: int) -> float:
        """Seconds from `arrival_s` until the request's token IDs are ready (queueing included). Calls
        must come in arrival order."""
        start_s = max(arrival_s, heapq.heappop(self._free_s))
        done_s = start_s + self.cost_s(num_prompt_tokens)
        heapq.heappush(self._free_s, done_s)
        return done_s - arrival_s
