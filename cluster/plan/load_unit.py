"""The unit of a plan's load grid, and so of its goodput: the offered load that meets a target.

Goodput is said in this one unit everywhere (the table, the explanation, the plots): requests per
second for a synthetic workload, conversations started per second for a conversation scenario, the
trace's speed for a trace. Per GPU it is that load over the candidate's GPUs (what the search ranks
by); per dollar, what that load serves in an hour over the candidate's hourly price.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoadUnit:
    unit: str
    """How a load reads: `req/s`."""
    per_usd: str
    """What one dollar buys at the goodput load: `requests per $`."""
    per_hour: float
    """What one hour at a load of 1 serves, in `per_usd`'s things: 3,600 requests at 1 req/s."""

    def per_dollar(self, load: float, usd_per_hour: float) -> float:
        return load * self.per_hour / usd_per_hour


LOAD_UNITS = {
    "workload.rate": LoadUnit("req/s", "requests per $", 3600.0),
    "replay.speedup": LoadUnit("x trace speed", "trace hours per $", 1.0),
    "multi_turn.conversation_rate": LoadUnit("conv/s", "conversations per $", 3600.0),
}
"""By the config key that sets the load (`cluster.load.load_key`)."""
