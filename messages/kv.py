"""KV crossing engine boundaries: prefix-cache events for a router, a pull's descriptor, its payload."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class KVEvents:
    """engine -> router: block hashes the engine's prefix cache gained and lost since its last batch
    (vLLM's BlockStored / BlockRemoved, net: a block stored and evicted within one batch is only
    removed). Hashes are the stable chained ones (`block_hash`), comparable across actors."""

    stored: list[bytes]
    removed: list[bytes]


@dataclass
class KVPull:
    """decode -> prefill: which held KV to send, and when its transfer may start (emulated)."""

    request_id: str
    """The held request (prefill's id for it)."""
    first_block: int
    """Blocks before it are in decode's own prefix cache: only the rest is sent."""
    start_s: float
    """When the transfer may start: decode's admission (pull) or prefill's send (push)."""
    wire_s: float
    """How long its bytes occupy the sender's link, where pulls from one prefill engine queue."""
    num_blocks: int | None = None
    """A pull back (bidirectional): only this many blocks from `first_block` (the full ones prefill
    takes); None: all the request holds from there."""


@dataclass
class KVPayload:
    """prefill -> decode: the runner's real KV of a request's prompt (numpy moves zero-copy in Ray)."""

    request_id: str
    kv: np.ndarray | None = field(repr=False)
    """[num_layers, 2 (K, V), num_kv_heads, num_tokens, head_dim] of the runner, from the pull's first
    block on; None with compute skip."""
    wire_start_s: float
    """Emulated time the sender's link starts sending it: pulls from one prefill engine queue there."""
