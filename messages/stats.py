"""A role -> its recorder and the run's summary: snapshots of an engine's scheduler (vLLM's
`SchedulerStats`, flattened) and of an encoder.

Taken at steps and on arrivals; the counts are totals since the role started.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulerStats:
    num_running_reqs: int
    num_waiting_reqs: int
    """Waiting to be scheduled, or for their KV to arrive."""
    kv_cache_usage: float
    """The share of the KV cache's blocks in use (0 to 1)."""
    num_prefix_cache_queries: int
    num_prefix_cache_hits: int
    num_preemptions: int
    num_kv_held_blocks: int
    """Blocks of finished requests held for a pull: prefill side, until decode's notice; decode side
    (bidirectional), for the conversation's next turn."""
    num_mm_cache_queries: int = 0
    num_mm_cache_hits: int = 0
    """The encoder cache's lookups of images, and its hits."""


@dataclass(frozen=True)
class EncoderStats:
    """An encoder's totals: its recorder's counters and the run's encoder summary read these values."""

    num_steps: int
    busy_s: float
    """Emulated seconds spent in steps."""
    num_mm_cache_queries: int
    num_mm_cache_hits: int
