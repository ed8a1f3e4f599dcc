"""Live mode's one clock across nodes: each actor reads its own process's monotonic clock less its
offset to the head's (the driver's), measured at start by halving round trips, as NTP does, on the
fastest of a few probes (its error is at most half that round trip):

    driver (head)   t0 ──────── probe ────────► t1
    actor                  remote = its clock            offset      = remote - (t0 + t1) / 2
                                                         uncertainty = (t1 - t0) / 2

Monotonic clocks never step (an NTP correction or a leap second moves `time.time()`, never them), so
the offset measured once holds for the run (their drift, ~10 ppm, is 36 ms an hour: re-measure for
longer live runs). Wall clocks are compared the same way, only to report how far apart they are.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray

from cluster.config_load import ConfigError

Probe = tuple[float, float, str]
"""What an actor answers a probe with: its monotonic clock, its wall clock, its node (`address/id`)."""


def probe() -> Probe:
    """This process's clocks and node (what an actor's `clock_probe` returns)."""
    node = f"{ray.util.get_node_ip_address()}/{ray.get_runtime_context().get_node_id()[:8]}"
    return time.monotonic(), time.time(), node


@dataclass(frozen=True)
class ClockOffset:
    node: str
    """The actor's node: its address and the first digits of its Ray node id."""
    offset_s: float
    """The actor's monotonic clock less the driver's (subtracted from its readings)."""
    uncertainty_s: float
    """Half the fastest probe's round trip: the offset's largest possible error."""
    wall_skew_s: float
    """The actor's wall clock less the driver's (reported only: the run's clock does not use it)."""


def offset_of(samples: Sequence[tuple[float, float, Probe, float, float]]) -> ClockOffset:
    """The offset from probes, each (driver monotonic before, driver wall before, the actor's answer,
    driver monotonic after, driver wall after): the fastest one's halving (pure)."""
    t0, w0, (remote, remote_wall, node), t1, w1 = min(samples, key=lambda s: s[3] - s[0])
    return ClockOffset(node, remote - (t0 + t1) / 2, (t1 - t0) / 2, remote_wall - (w0 + w1) / 2)


def measure(ask: Callable[[], Probe], num_probes: int = 8) -> ClockOffset:
    """Probe an actor `num_probes` times (`ask`: one round trip to it) and take the fastest."""
    samples = []
    for _ in range(num_probes):
        t0, w0 = time.monotonic(), time.time()
        answer = ask()
        samples.append((t0, w0, answer, time.monotonic(), time.time()))
    return offset_of(samples)


def measure_actor(handle: Any) -> ClockOffset:
    """`measure` an actor whose class has `clock_probe` (returning `probe()`)."""
    return measure(lambda: ray.get(handle.clock_probe.remote()))


def check_uncertainty(offsets: dict[str, ClockOffset], max_uncertainty_s: float) -> None:
    """Refuse (one line) an actor whose offset is known no better than `max_uncertainty_s`."""
    for actor, o in offsets.items():
        if o.uncertainty_s > max_uncertainty_s:
            raise ConfigError(
                f"clock.max_sync_uncertainty_s={max_uncertainty_s:g}: {actor} on node {o.node} is in step "
                f"with the head only within {o.uncertainty_s * 1e3:.3g} ms (half its fastest round trip); "
                "allowed: a larger bound, or a faster network between the nodes"
            )


def sync_summary(offsets: dict[str, ClockOffset]) -> dict[str, dict[str, float]]:
    """Per node: its monotonic offset's largest uncertainty over its actors, and its wall clock's skew
    from the head's (ms)."""
    out: dict[str, dict[str, float]] = {}
    for o in offsets.values():
        node = out.setdefault(o.node, {"uncertainty_ms": 0.0, "wall_skew_ms": o.wall_skew_s * 1e3})
        node["uncertainty_ms"] = max(node["uncertainty_ms"], o.uncertainty_s * 1e3)
    return out
