"""The receiving side of a KV handoff: when a transfer starts and ends in emulated time.

The wire part of a transfer serialises on its link (first come, first served); latency and fixed
overheads overlap between transfers::

    link   |== wire A ==|== wire B ==|
    A      start ------------------------- overhead ----> done A
    B        start (queued)   ----------------- overhead ----> done B

pull: the decode engine starts reading at the step boundary that admits the request, and sees the
      completed transfer at its first step boundary at or after `done` (at `done` itself when it has
      nothing to run: an idle engine keeps polling).
push: the prefill engine starts sending when it finishes the prompt (or, layer-wise, while it computes),
      and the decode engine is notified at `done`; it can still only join at a step boundary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from target.config import KVTransferConfig
from target.profiles import LinkProfile, ModelProfile
from target.transfer import HandoffTime, handoff_time, layerwise_handoff_time


@dataclass(frozen=True)
class TransferPlan:
    start_s: float
    done_s: float
    kv_bytes: int
    time: HandoffTime


class KVReceiver:
    def __init__(
        self, cfg: KVTransferConfig, link: LinkProfile, target: ModelProfile, block_size: int
    ) -> None:
        self.cfg = cfg
        self.link = link
        self.target = target
        self.block_size = block_size
        self._wire_free_s: dict[str, float] = {}
        """Per remote engine: when its link's wire is next free."""

    def plan(self, params: dict[str, Any], admitted_s: float) -> TransferPlan:
        """Emulated timing of pulling (or receiving the push of) the KV that `params` describes."""
        num_blocks = len(params["remote_block_ids"])
        kv_bytes = num_blocks * self.block_size * self.target.kv_bytes_per_token
        if self.cfg.mode == "push":
            start = float(params["kv_sent_s"])
            if self.cfg.layerwise:
                t = layerwise_handoff_time(
                    kv_bytes,
                    num_blocks,
                    self.link,
                    float(params["prefill_compute_s"]),
                    self.target.num_layers,
                )
            else:
                t = handoff_time(kv_bytes, num_blocks, self.link)
        else:
            start = admitted_s
            t = handoff_time(kv_bytes, num_blocks, self.link)
        remote = str(params["remote_engine_id"])
        wire_start = max(start, self._wire_free_s.get(remote, 0.0))
        self._wire_free_s[remote] = wire_start + t.wire_s
        return TransferPlan(start_s=start, done_s=wire_start + t.total_s, kv_bytes=kv_bytes, time=t)
