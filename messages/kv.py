"""KV crossing engine boundaries: prefix-cache events for a router, a pull's descriptor, its payload."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class BlockStored:
    """Blocks entered into an engine's prefix cache or one of its offload tiers (vLLM's BlockStored event)."""

    block_hashes: list[bytes]
    """The stable chained hashes (`block_hash`), comparable across actors."""
    medium: str = "gpu"
    """Which of the engine's tiers (vLLM's event `medium`): gpu, or an offload tier (host, disk), so
    that a router weighs a hit by where it is."""


@dataclass
class BlockRemoved:
    """Blocks evicted from an engine's prefix cache or an offload tier (vLLM's BlockRemoved event)."""

    block_hashes: list[bytes]
    medium: str = "gpu"


@dataclass
class KVEvents:
    """engine -> router: what the engine's prefix cache gained and lost since its last batch, in the
    order it happened (vLLM's KVEventBatch): a router applying them in order holds what the engine
    holds."""

    events: list[BlockStored | BlockRemoved]


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


@dataclass(frozen=True)
class SsmState:
    """A hybrid model's request state over all its SSM (Mamba2) layers, as of one token: float32 numpy,
    vLLM's layout (`emulation/ssm.py`)::

        conv  [L_ssm, conv_kernel - 1, conv_dim]                          the last K-1 inputs of the
                                                                          causal convolution
        ssm   [L_ssm, mamba_num_heads, mamba_head_dim, ssm_state_size]    the recurrent state

    L_ssm: the Mamba2 layers in model order; conv_dim = heads x head_dim + 2 x n_groups x state_size.
    It does not say which token it is as of: a state of the wrong one computes silently wrong."""

    conv: np.ndarray = field(repr=False)
    ssm: np.ndarray = field(repr=False)

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes


@dataclass
class KVPayload:
    """prefill -> decode: the runner's real KV of a request's prompt (numpy moves zero-copy in Ray)."""

    request_id: str
    kv: np.ndarray | None = field(repr=False)
    """[num_layers, 2 (K, V), num_kv_heads, num_tokens, head_dim] of the runner, from the pull's first
    block on; None with compute skip."""
    wire_start_s: float
    """Emulated time the sender's link starts sending it: pulls from one prefill engine queue there."""
    state: SsmState | None = None
    """A hybrid model's SSM state as of the last token prefill computed (its prompt but the last, so
    decode computes that one from it); None without SSM layers, or with compute skip."""


@dataclass
class KVStoreChanges:
    """shared KV store -> an engine: what the store gained and lost since the engine's last call, so
    that the engine's view of it (what its lookups read without a call) follows it."""

    entries: list[tuple[bytes, float | None]]
    """In order: (block hash, when its store completes) for a block any engine stored, (block hash,
    None) for one the store evicted."""
