"""What one engine step computes: the scheduler's output, read by the executor, the time model and the
engine's windows."""

from __future__ import annotations

from dataclasses import dataclass, field

from actors.engine.request import Request
from actors.engine.scheduling.encoder_cache import EncoderCache
from actors.engine.scheduling.encoder_inputs import encoder_inputs
from emulation.step_shape import StepShape
from messages import MultiModalItem


@dataclass
class ScheduledBatch:
    """What one step computes, with the batch totals the roofline needs."""

    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    shape: StepShape = field(default_factory=StepShape)
    """The totals the time model needs."""
    new_remote_requests: list[Request] = field(default_factory=list)
    """Decode side: requests that got their blocks this step and now wait for the remote KV."""
    preempted: list[Request] = field(default_factory=list)
    """Requests preempted while scheduling this step (their KV is gone; they will recompute)."""
    new_offload_loads: list[Request] = field(default_factory=list)
    """Requests that got their blocks this step and now wait for KV from the engine's offload tiers."""
    pull_backs_taking_nothing: list[Request] = field(default_factory=list)
    """Prefill side: pull backs that found nothing to take (decode may release what it held)."""
    encoder_inputs: list[tuple[Request, MultiModalItem]] = field(default_factory=list)
    """Images this step encodes (before the forward pass), each for the request whose chunk reaches it."""
    num_encoder_embeds: int = 0

    @property
    def num_scheduled_tokens(self) -> int:
        return self.shape.num_new_tokens

    def add(self, req: Request, n: int) -> None:
        c = req.num_computed_tokens
        self.requests.append(req)
        self.num_new_tokens.append(n)
        self.shape.add(n, c, c + n == req.num_tokens)

    def add_images(self, req: Request, n: int, cache: EncoderCache, max_num_encoder_embeds: int) -> int:
        """Of `req`'s next `n` tokens, those whose images can be encoded in this step (`encoder_inputs`:
        within `max_num_encoder_embeds` a step, `cache` holding the others); those images join it."""
        budget = max_num_encoder_embeds - self.num_encoder_embeds
        n, items = encoder_inputs(req, n, cache, budget, self.num_encoder_embeds == 0)
        for item in items:
            self.encoder_inputs.append((req, item))
            self.num_encoder_embeds += item.num_tokens
        return n

    def drop_images(self, keep: int) -> None:
        """Forget the images scheduled after the first `keep` (their request computes nothing now)."""
        for _, item in self.encoder_inputs[keep:]:
            self.num_encoder_embeds -= item.num_tokens
        del self.encoder_inputs[keep:]
