"""KV handoff time over a link: pure functions returning itemised results.

Whole-request transfer (the KV exists in full before it moves)::

    t = bytes / (bandwidth · lanes) + latency + per_transfer_overhead + per_block_overhead · num_blocks
        \\______ wire_s ______/

Between tensor-parallel engines each GPU moves its share of the KV heads on its own link (a NIC per
GPU), so min(tp_sender, tp_receiver) lanes carry it in parallel, in max(tp_sender, tp_receiver)
rank-to-rank transfers (`tp_transfer`): a lane handles the descriptors of max/min of them.

Layer-wise streaming (each layer's KV is sent while the next layer computes): the transfer overlaps the
producing compute, so only what does not fit under it, plus the last layer's share, is exposed::

    compute  |==L1==|==L2==| ... |==Ln==|
    transfer        |--L1--|--L2--| ... |--Ln--|
                                        \\_ t/n _/ + max(0, t - compute)
"""

from __future__ import annotations

from dataclasses import dataclass

from emulation.profiles import LinkProfile


@dataclass(frozen=True)
class HandoffTime:
    wire_s: float
    """Bytes over the link's bandwidth; the only part that serialises on a shared link."""
    latency_s: float
    overhead_s: float
    """Per-transfer plus per-block fixed costs; these overlap between concurrent transfers."""
    hidden_s: float = 0.0
    """Time hidden under compute by layer-wise streaming (subtracted from the total)."""

    @property
    def total_s(self) -> float:
        return self.wire_s + self.latency_s + self.overhead_s - self.hidden_s


@dataclass(frozen=True)
class TPTransfer:
    """How a KV handoff splits between a `tp_sender`-GPU and a `tp_receiver`-GPU engine."""

    num_transfers: int
    """Rank-to-rank transfers: each decode rank's heads from the prefill rank(s) holding them."""
    lanes: int
    """Links carrying them at once (the smaller side's GPUs)."""

    @property
    def transfers_per_lane(self) -> int:
        return self.num_transfers // self.lanes


def tp_transfer(tp_sender: int, tp_receiver: int) -> TPTransfer:
    return TPTransfer(max(tp_sender, tp_receiver), min(tp_sender, tp_receiver))


def handoff_time(kv_bytes: int, num_blocks: int, link: LinkProfile, lanes: int = 1) -> HandoffTime:
    """`num_blocks`: block descriptors one lane handles (its transfers' blocks)."""
    return HandoffTime(
        wire_s=kv_bytes / (link.bytes_per_s * lanes),
        latency_s=link.latency_s,
        overhead_s=link.per_transfer_overhead_s + link.per_block_overhead_s * num_blocks,
    )


def layerwise_handoff_time(
    kv_bytes: int, num_blocks: int, link: LinkProfile, compute_s: float, num_layers: int, lanes: int = 1
) -> HandoffTime:
    """Handoff streamed layer by layer during `compute_s` of producing compute over `num_layers`."""
    full = handoff_time(kv_bytes, num_blocks, link, lanes)
    exposed = min(full.total_s, max(0.0, full.total_s - compute_s) + full.total_s / num_layers)
    return HandoffTime(full.wire_s, full.latency_s, full.overhead_s, hidden_s=full.total_s - exposed)
