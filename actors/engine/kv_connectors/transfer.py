"""A KV handoff's emulated timing, and the link it queues on.

The wire part of a transfer serialises on its link (first come, first served); latency and fixed
overheads overlap between transfers::

    link   |== wire A ==|== wire B ==|
    A      start ------------------------- overhead ----> done A
    B        start (queued)   ----------------- overhead ----> done B

The sender asks the link for each transfer's wire start (`Link.reserve`), whichever decode engine
started it. By default each prefill engine has its own queue (`LinkQueue`: its egress path; decode
engines on other nodes share it as NIXL's reads from one GPU do); `kv_transfer.link_scope=fabric`
gives every prefill engine the same one (in live mode an actor holding it).

pull: the decode engine starts reading at the step boundary that admits the request, and sees the
      completed transfer at its first step boundary at or after `done` (at `done` itself when it has
      nothing to run: an idle engine keeps polling).
push: the prefill engine starts sending when it finishes the prompt (or, layer-wise, while it computes),
      and the decode engine is notified at `done`; it can still only join at a step boundary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from emulation.config import KVTransferConfig, LinkSlowdown
from emulation.profiles import LinkProfile, ModelProfile
from emulation.transfer import HandoffTime, handoff_time, layerwise_handoff_time, tp_transfer
from messages import KVTransferParams


@dataclass(frozen=True)
class TransferPlan:
    first_block: int
    """The first of the request's blocks that moves (decode's prefix cache holds those before)."""
    num_blocks: int
    start_s: float
    """When the transfer may start: decode's admission (pull) or prefill's send (push)."""
    kv_bytes: int
    time: HandoffTime
    wire_start_s: float | None = None
    """When the sender's link starts sending it (None: not queued on the link yet)."""
    state_bytes: int = 0
    """A hybrid target's SSM state, sent beside the KV (`kv_bytes`)."""

    @property
    def done_s(self) -> float:
        assert self.wire_start_s is not None, "a transfer is done only once its link has queued it"
        return self.wire_start_s + self.time.total_s

    def queued(self, wire_start_s: float) -> TransferPlan:
        return dataclasses.replace(self, wire_start_s=wire_start_s)


class KVReceiver:
    """The receiving side's view of a transfer: its size and its unqueued time over the link.

    Between TP engines (`tp` here, `peer_tp` the sender's) the bytes are what this side holds (each
    GPU its KV heads, replicated past num_kv_heads ranks), on min(tp, peer_tp) links at once
    (`emulation.transfer`)."""

    def __init__(
        self,
        cfg: KVTransferConfig,
        *,
        link: LinkProfile,
        model: ModelProfile,
        block_size: int,
        tp: int = 1,
        peer_tp: int = 1,
        slowdowns: Sequence[LinkSlowdown] = (),
    ) -> None:
        """`slowdowns`: windows in which a transfer that starts moves its bytes slower (`faults`)."""
        self.cfg = cfg
        self.slowdowns = slowdowns
        self.link = link
        self.model = model
        self.block_size = block_size
        self.split = tp_transfer(peer_tp, tp)
        kv_bytes_per_token = round(model.kv_bytes_per_token_per_gpu(tp) * tp)
        self.sliding_kv_bytes_per_token = round(
            kv_bytes_per_token * model.num_sliding_layers / max(1, model.num_attention_layers)
        )
        """Of a token's KV, the sliding-window layers' (gpt-oss: half), which moves for the window only."""
        self.full_kv_bytes_per_token = kv_bytes_per_token - self.sliding_kv_bytes_per_token
        window = model.sliding_window if model.num_sliding_layers else None
        self.max_sliding_blocks = -(-window // block_size) + 1 if window else 0
        """The sliding-window group's blocks a handoff moves at most: vLLM's NIXL connector clips that
        group's block list to its last cdiv(window, block_size) + 1 (`blocks_per_sw`; the blocks before
        left the window, freed on prefill)."""
        self.state_bytes = model.state_bytes_per_gpu(tp) * tp
        """A hybrid's state as this side holds it: each rank reads its slice of each sub-projection
        (vLLM's DS conv layout), so a TP change moves the same bytes."""
        self.num_state_blocks = model.kv_cache_groups.num_state_groups

    def plan(self, params: KVTransferParams, blocks_ready_s: float, first_block: int = 0) -> TransferPlan:
        """Emulated timing of pulling (or receiving the push of) the KV that `params` describes, from
        its `first_block` on (decode's prefix cache holds those before), into blocks that exist from
        `blocks_ready_s` on.

        A push starts when both prefill has finished and decode's blocks exist. Layer-wise, it hides
        under prefill's own compute (not its queueing, nor other requests' chunks) that ran after the
        blocks existed: at most min(own compute, kv_sent - blocks_ready)."""
        assert params.remote_block_ids is not None
        num_blocks = len(params.remote_block_ids) - first_block
        num_sliding_blocks = min(num_blocks, self.max_sliding_blocks)
        bs = self.block_size
        kv_bytes = bs * (
            num_blocks * self.full_kv_bytes_per_token + num_sliding_blocks * self.sliding_kv_bytes_per_token
        )
        state_bytes = self.state_bytes if not params.remote_block_hashes else 0  # (no pull back's)
        lanes = self.split.lanes
        num_regions = num_blocks + num_sliding_blocks + self.num_state_blocks * bool(state_bytes)
        descriptors = num_regions * self.split.transfers_per_lane
        if self.cfg.mode == "pull":
            start_s = blocks_ready_s
        else:
            assert params.kv_sent_s is not None, "a push starts once prefill has sent"
            start_s = max(params.kv_sent_s, blocks_ready_s)
        link = self._link_at(start_s)
        t = handoff_time(kv_bytes + state_bytes, descriptors, link, lanes)
        if self.cfg.mode == "push" and self.cfg.layerwise:
            sent_s, compute_s = params.kv_sent_s, params.prefill_compute_s
            assert sent_s is not None and compute_s is not None
            hideable_s = min(compute_s, max(0.0, sent_s - blocks_ready_s))
            layers = self.model.num_layers
            t = layerwise_handoff_time(kv_bytes + state_bytes, descriptors, link, hideable_s, layers, lanes)
        return TransferPlan(first_block, num_blocks, start_s, kv_bytes, t, state_bytes=state_bytes)

    def _link_at(self, start_s: float) -> LinkProfile:
        """The link a transfer starting at `start_s` sees: slowed inside a slowdown window."""
        for w in self.slowdowns:
            if w.start_s <= start_s < w.end_s:
                return dataclasses.replace(self.link, link_gbps=self.link.link_gbps * w.bandwidth_factor)
        return self.link


class Link(Protocol):
    """A link's wire as senders see it: a `LinkQueue`, or a client of the actor holding one."""

    async def reserve(self, start_s: float, wire_s: float) -> float: ...


class LinkQueue:
    """A link's wires, granted first come, first served: one, or one a data-parallel attention rank of
    an expert-parallel prefill replica (each rank sends on its own NIC)."""

    def __init__(self, num_wires: int = 1) -> None:
        self._free_s = [0.0] * num_wires
        """When each wire is next free (emulated)."""

    async def reserve(self, start_s: float, wire_s: float) -> float:
        """Queue `wire_s` of sending that may start at `start_s` on the wire free soonest; when it starts."""
        return self.reserve_now(start_s, wire_s)

    def reserve_now(self, start_s: float, wire_s: float) -> float:
        """`reserve`, for a sender holding the queue itself (an engine's own offload tiers)."""
        i = min(range(len(self._free_s)), key=self._free_s.__getitem__)
        wire_start = max(start_s, self._free_s[i])
        self._free_s[i] = wire_start + wire_s
        return wire_start
