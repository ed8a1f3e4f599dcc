"""Faults injected on purpose."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from emulation.config.strict import STRICT


@dataclass(frozen=True)
class EngineFault:
    """An engine and when a fault strikes it."""

    __pydantic_config__ = STRICT

    engine: str
    """The engine's id, `<role>-<replica>` (prefill-0, decode-1, mixed-0)."""
    at_s: Annotated[float, Field(ge=0)]
    """Emulated seconds from the run's start."""


@dataclass(frozen=True)
class LinkSlowdown:
    __pydantic_config__ = STRICT

    start_s: Annotated[float, Field(ge=0)]
    end_s: float
    """The emulated window [start_s, end_s) in which KV transfers start slowed."""
    bandwidth_factor: Annotated[float, Field(gt=0)]
    """The link's bandwidth times this (0.1: a tenth of it) for those transfers."""


@dataclass(frozen=True)
class FaultsConfig:
    """Faults injected on purpose (all off by default); deterministic for a seed in virtual mode."""

    __pydantic_config__ = STRICT

    kv_transfer_failure_rate: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Each KV load into a decode (or pull-back prefill) engine fails with this probability, drawn from
    the run's seed and the engine's id. A failed load takes its transfer's time, then fails."""
    kv_transfer_failures: tuple[Annotated[int, Field(ge=1)], ...] = ()
    """Also fail these loads (1-based, counted per receiving engine): `[1, 5]` fails each engine's
    first and fifth."""
    link_slowdowns: tuple[LinkSlowdown, ...] = ()
    """KV links slowed in emulated windows (several make a flapping link): a transfer that starts in
    one moves its bytes at `bandwidth_factor` of the link's bandwidth (latency and fixed costs as
    they are)."""
    engine_kills: tuple[EngineFault, ...] = ()
    """Engines killed at an emulated time: their requests fail (or, a prefill engine's, are retried
    elsewhere by the proxy), later calls to them fail as a dead actor's do. Live: the actor is killed."""
    proxy_kills: tuple[Annotated[float, Field(ge=0)], ...] = ()
    """Emulated times the proxy dies: every request in flight through it fails (the engines abort
    them), and it comes back at once with empty routers (live: the actor is killed and a new one
    takes its place, as a supervisor restarts a crashed proxy; requests sent meanwhile wait for it)."""
    engine_hangs: tuple[EngineFault, ...] = ()
    """Prefill engines that stop answering at an emulated time (a wedged GPU or process): no error,
    no more steps; their requests wait until the proxy gives up on them (`router.prefill_timeout_s`,
    which these need) and retries them on another prefill engine. Live: the actor's step loop stops."""
    ssm_state_at_n: bool = False
    """Hybrid targets in P/D: prefill computes the whole prompt and hands over its SSM state as of the
    last token (not N-1, as vLLM's NIXL connector does); decode then computes that token again on top
    of a state that already holds it, and its output is silently wrong (real compute shows it)."""
