"""Injected KV load failures (`faults.kv_transfer_failure_rate`, `faults.kv_transfer_failures`): which of
a receiving engine's loads fail, decided in the order it starts them, the same for a seed and an engine
in every run."""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import numpy as np


class KVLoadFaults:
    """Whether each of an engine's KV loads fails on purpose."""

    def __init__(self, *, rate: float, nth: Iterable[int], seed: int, engine_id: str) -> None:
        """`rate`: each load's probability of failing; `nth`: loads (1-based) that fail anyway."""
        self.rate = rate
        self.nth = frozenset(nth)
        self.num_loads = 0
        self._rng = np.random.default_rng([seed, zlib.crc32(engine_id.encode())])  # stable across runs

    def next_fails(self) -> bool:
        """Whether the engine's next load fails (one draw a load whatever `nth` says, so that listing
        a load to fail leaves the draws of the others as they were)."""
        self.num_loads += 1
        drawn = bool(self._rng.random() < self.rate) if self.rate > 0 else False
        return drawn or self.num_loads in self.nth
