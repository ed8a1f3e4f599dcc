"""KV handoff time over a link: pure functions returning itemised results.

Whole-request transfer (the KV exists in full before it moves)::

    t = bytes / bandwidth + latency + per_transfer_overhead + per_block_overhead · num_blocks
        \\___ wire_s ___/

Layer-wise streaming (each layer's KV is sent while the next layer computes): the transfer overlaps the
producing compute, so only what does not fit under it, plus the last layer's share, is exposed::

    compute  |==L1==|==L2==| ... |==Ln==|
    transfer        |--L1--|--L2--| ... |--Ln--|
                                        \\_ t/n _/ + max(0, t - compute)
"""

from __future__ import annotations

from dataclasses import dataclass

from target.profiles import LinkProfile


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


def handoff_time(kv_bytes: int, num_blocks: int, link: LinkProfile) -> HandoffTime:
    return HandoffTime(
        wire_s=kv_bytes / link.bytes_per_s,
        latency_s=link.latency_s,
        overhead_s=link.per_transfer_overhead_s + link.per_block_overhead_s * num_blocks,
    )


def layerwise_handoff_time(
    kv_bytes: int, num_blocks: int, link: LinkProfile, compute_s: float, num_layers: int
) -> HandoffTime:
    """Handoff streamed layer by layer during `compute_s` of producing compute over `num_layers`."""
    full = handoff_time(kv_bytes, num_blocks, link)
    exposed = min(full.total_s, max(0.0, full.total_s - compute_s) + full.total_s / num_layers)
    return HandoffTime(full.wire_s, full.latency_s, full.overhead_s, hidden_s=full.total_s - exposed)
