"""Block-aligned chunked prefill for hybrid models with prefix caching (vLLM's align mode,
`Scheduler._mamba_block_aligned_split`): a state exists only where a step ends (or, for Mamba2, at one
point a step exports), so prompt chunks end on block boundaries and at the prompt's checkpoint, where
the state is cached (`state_cache.py`)::

    prompt      [.... block ....|.... block ....|.... block ....|..]     N tokens, block_size bs
    a chunk     start ───────────────────► end          rounded down to a block boundary unless it
                                                        ends the prompt, or a budget under bs forces
                                                        sub-block chunks (they re-align at the next)
    checkpoint                                  P = floor((N - 1) / bs) · bs: a chunk stops there, unless
                                                the mixer exports the state from inside the step
                                                (Mamba2: `internal_checkpoint`) and the chunk starts on a
                                                boundary at least a block before P

A request whose budget this step cannot reach a boundary gets 0 tokens: a waiting one stops admission,
a running one waits a step (vLLM's rules). Decodes are never cut.
"""

from __future__ import annotations

from actors.engine.kv_cache.state_cache import checkpoint_position
from actors.engine.request import Request


def block_aligned_split(
    req: Request, num_new_tokens: int, *, block_size: int, max_prefill_tokens: int, internal_checkpoint: bool
) -> int:
    """Of `num_new_tokens` the budget gives `req` this step, those it computes."""
    bs, start = block_size, req.num_computed_tokens
    end = start + num_new_tokens
    prefill_end = max(req.num_prompt_tokens, req.num_tokens - 1)
    if start >= prefill_end:
        return num_new_tokens
    last = checkpoint_position(req.num_prompt_tokens, bs)
    internal = internal_checkpoint and end >= prefill_end and start % bs == 0 and start + bs <= last < end
    if internal:
        last = 0
    if end < prefill_end:
        aligned = end // bs * bs
        if aligned > start or bs <= max_prefill_tokens:
            end = aligned
    next_boundary = (start // bs + 1) * bs if start % bs and not internal else 0
    end = min((s for s in (next_boundary, last) if start < s < end), default=end)
    return max(end - start, 0)
