"""What one engine step computes, as the time models see it: a few totals over its scheduled requests.

A request with `c` tokens already in the cache and `n` new ones this step: new token i (position c+i,
0-based) attends to c+i+1 keys::

    keys attended = Σ_{i=0}^{n-1} (c+i+1) = n·c + n(n+1)/2

A request computing one token (n = 1) is a decode: its attention reads its whole KV (c + 1 tokens)
for one query, memory-bound. A request computing more (a prompt chunk) is a prefill: its attention is
compute-bound, causal over its context. The aggregate roofline needs only the sums; the per-operator
one splits attention by kind and counts the requests (CPU work per request).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


def keys_attended(num_new_tokens: int, num_context_tokens: int) -> int:
    """Keys the new tokens of one request attend to, with `num_context_tokens` already cached:
    Σ_{i=0}^{n-1} (c+i+1) = n·c + n(n+1)/2 (see the module's docstring)."""
    n = num_new_tokens
    return n * num_context_tokens + n * (n + 1) // 2


@dataclass(frozen=True)
class StepItem:
    """One request's share of a step."""

    num_new_tokens: int
    num_context_tokens: int
    """Tokens already in the KV cache before this step (num_computed_tokens)."""
    needs_logits: bool


@dataclass
class StepShape:
    """Totals of one step's scheduled requests (the scheduler adds each as it schedules it)."""

    num_new_tokens: int = 0
    num_logits: int = 0
    num_requests: int = 0
    keys_attended: int = 0
    num_context_tokens: int = 0
    """KV tokens cached before this step, over every request (what the step reads)."""
    num_decodes: int = 0
    """Requests computing exactly one token."""
    decode_keys_attended: int = 0
    """Of `keys_attended`, the decodes' (each decode's c + 1: also the KV tokens it reads)."""
    max_num_new_tokens: int = 0
    """The most new tokens one request computes in the step (a request runs on one DP attention rank)."""

    def add(self, num_new_tokens: int, num_context_tokens: int, needs_logits: bool) -> None:
        n, c = num_new_tokens, num_context_tokens
        keys = keys_attended(n, c)
        self.num_new_tokens += n
        self.num_logits += needs_logits
        self.num_requests += 1
        self.keys_attended += keys
        self.num_context_tokens += c
        if n > self.max_num_new_tokens:
            self.max_num_new_tokens = n
        if n == 1:
            self.num_decodes += 1
            self.decode_keys_attended += keys

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_new_tokens - self.num_decodes

    @property
    def prefill_keys_attended(self) -> int:
        return self.keys_attended - self.decode_keys_attended

    @property
    def prefill_kv_tokens(self) -> int:
        """KV tokens the prefill chunks touch: their cached context, read, and their new tokens,
        written (a decode's are `decode_keys_attended`)."""
        return self.num_context_tokens + self.num_new_tokens - self.decode_keys_attended

    @classmethod
    def of(cls, items: Iterable[StepItem]) -> StepShape:
        shape = cls()
        for it in items:
            shape.add(it.num_new_tokens, it.num_context_tokens, it.needs_logits)
        return shape


def decode_steps(shape: StepShape, num_steps: int) -> StepShape:
    """The shapes of `num_steps` steps that repeat the decode-only step `shape`, as one StepShape whose
    growing totals are arrays (step i of them at index i): each step every decode reads one more KV
    token, the rest stays. The time models evaluate it elementwise (`roofline.maximum`)::

        step i:  num_context_tokens + i·num_decodes,  keys_attended + i·num_decodes  (decode_ too)
    """
    return _decoded_ahead(shape, np.arange(num_steps, dtype=np.int64))  # type: ignore[arg-type]


def decode_step(shape: StepShape, i: int) -> StepShape:
    """The decode-only step `shape` repeated `i` steps later (`decode_steps`'s step i, as ints)."""
    return _decoded_ahead(shape, i)


def _decoded_ahead(shape: StepShape, i: int) -> StepShape:
    assert shape.num_decodes == shape.num_new_tokens, "decode-only steps: one new token a request"
    grow = i * shape.num_decodes
    return StepShape(  # arrays where the fields say int, for `decode_steps`: read elementwise
        num_new_tokens=shape.num_new_tokens,
        num_logits=shape.num_logits,
        num_requests=shape.num_requests,
        keys_attended=shape.keys_attended + grow,
        num_context_tokens=shape.num_context_tokens + grow,
        num_decodes=shape.num_decodes,
        decode_keys_attended=shape.decode_keys_attended + grow,
        max_num_new_tokens=shape.max_num_new_tokens,
    )


def share_of(shape: StepShape, parts: float) -> StepShape:
    """One of `parts` equal shares of `shape`: a data-parallel attention rank's (the step's requests
    spread evenly over the ranks) or a micro-batch's. Totals divided, so fractional (an average share);
    `parts` need not be whole (a rank holding more than an even share)."""
    if parts == 1:
        return shape
    return StepShape(
        **{f: getattr(shape, f) / parts for f in shape.__dataclass_fields__}  # type: ignore[arg-type]
    )


def busiest_rank(shape: StepShape, num_ranks: int) -> StepShape:
    """The busiest of `num_ranks` data-parallel attention ranks' share of `shape`: an even share, or, if
    more, the step's largest request's (a request's tokens run on one rank)."""
    if num_ranks == 1 or not shape.num_new_tokens:
        return shape
    return share_of(shape, 1 / max(1 / num_ranks, shape.max_num_new_tokens / shape.num_new_tokens))
