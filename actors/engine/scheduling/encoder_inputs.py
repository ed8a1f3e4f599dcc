"""Which images a step encodes: those its prompt chunks reach whose embeddings the request lacks.

As vLLM's scheduler does it (`_try_schedule_encoder_inputs`): a chunk [c, c+n) of a request's tokens
needs the embeddings of every image it overlaps. Each one is found in the request's own embeddings,
then in the engine's encoder cache (a hit), or else encoded in this step, within the step's encoder
budget; an image that does not fit cuts the chunk before it::

    prompt   [ text  |<image 1 ......>| text |<image 2 ....>| text ]
    chunk              c ─────────────────────────── c+n
    budget   image 1 fits: encoded     image 2 does not: chunk cut here ┘ (n = offset₂ − c)

An image larger than the whole budget is encoded alone in a step of its own (vLLM floors the budget
at the largest item).
"""

from __future__ import annotations

from actors.engine.request import Request
from actors.engine.scheduling.encoder_cache import EncoderCache
from messages import MultiModalItem


def encoder_inputs(
    req: Request, n: int, cache: EncoderCache, budget: int, budget_unused: bool
) -> tuple[int, list[MultiModalItem]]:
    """The tokens of `req` the step may compute (`n` or fewer) and the images to encode for them;
    `budget`: visual tokens the step may still encode (`budget_unused`: none encoded yet). Cache hits
    are attached to the request here."""
    c = req.num_computed_tokens
    to_encode: list[MultiModalItem] = []
    for item in req.mm_items:
        if item.offset >= c + n or item.offset + item.num_tokens <= c or item.mm_hash in req.mm_embeds:
            continue
        hit, embeds = cache.lookup(item.mm_hash)
        if hit:
            req.mm_embeds[item.mm_hash] = embeds
            continue
        fits = item.num_tokens <= budget or (budget_unused and not to_encode)
        if not fits:
            return max(0, item.offset - c), to_encode
        to_encode.append(item)
        budget -= item.num_tokens
    return n, to_encode
