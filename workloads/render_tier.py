"""The render tier as a replayed run sees it: a cost model, since a trace holds token IDs already.

`render.replicas` CPU workers each render one request at a time, first come first served on the replica
free soonest, for `s_per_call + s_per_prompt_token x text tokens` seconds plus, for each image,
`s_per_image + s_per_image_pixel x its processed pixels` (visual tokens x (patch x merge)² of the
target's processor); all fitted to the project's own render tier by `bench/render_cost.py`::

    arrival ─ wait (every replica busy) ─ render ─ done        render_s = done - arrival

Behind `testbed serve` nothing is modelled: every render is timed on the run's clock.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

from emulation.config import RenderConfig, TestbedConfig
from emulation.vision import vision_encoder_of
from emulation.vision_encoders import VisionEncoderProfile
from messages import ClientRequest


class RenderTier:
    def __init__(self, cfg: RenderConfig, vision: VisionEncoderProfile | None = None) -> None:
        """`vision`: the target's vision encoder, whose processor sets the pixels of a visual token."""
        self.cfg = cfg
        self._pixels_per_token = 0 if vision is None else (vision.patch_size * vision.merge_size) ** 2
        self._free_s = [0.0] * cfg.replicas  # when each replica is next free (a heap)

    def cost_s(self, num_prompt_tokens: int, image_tokens: Sequence[int] = ()) -> float:
        """One render's CPU seconds: a prompt of `num_prompt_tokens`, of which images of `image_tokens`
        visual tokens each."""
        c = self.cfg
        text_s = c.s_per_call + c.s_per_prompt_token * (num_prompt_tokens - sum(image_tokens))
        pixels = self._pixels_per_token * sum(image_tokens)
        return text_s + c.s_per_image * len(image_tokens) + c.s_per_image_pixel * pixels

    def render_s(self, arrival_s: float, num_prompt_tokens: int, image_tokens: Sequence[int] = ()) -> float:
        """Seconds from `arrival_s` until the request's token IDs are ready (queueing included). Calls
        must come in arrival order."""
        start_s = max(arrival_s, heapq.heappop(self._free_s))
        done_s = start_s + self.cost_s(num_prompt_tokens, image_tokens)
        heapq.heappush(self._free_s, done_s)
        return done_s - arrival_s

    def rendered(self, creq: ClientRequest) -> ClientRequest:
        """`creq` with its `render_s` from this tier, from its arrival (`render_s`: in arrival order)."""
        image_tokens = [m.num_tokens for m in creq.mm_items]
        render_s = self.render_s(creq.arrival_s, len(creq.prompt_token_ids), image_tokens)
        return dataclasses.replace(creq, render_s=render_s)


def render_tier_for(cfg: TestbedConfig) -> RenderTier:
    """`cfg`'s render tier: its replicas and costs, images at its target's processor's pixels."""
    return RenderTier(cfg.render, vision_encoder_of(cfg.target.model))
