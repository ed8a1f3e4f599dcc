"""A trace's theoretical prefix-hit rate: what an infinite prefix cache could serve.

Requests in send order (the trace's timestamps); each one's longest prefix of full blocks that any
earlier request also had counts as hits. Hash-ID prompts compare IDs at the trace's block size (as
kv-cache-tester and InferenceX compute it); token prompts compare 16-token blocks. Blocks are chained,
so a block hits only with everything before it::

    hit tokens / prompt tokens, summed over every request

An engine gets less: a finite cache, the last prompt token always computed, and (with several
replicas) the router choosing where each prompt's prefix is; its blocks, finer than a trace's, can hit
a little more of a partly shared trace block.
"""

from __future__ import annotations

from workloads.traces.session import ChatPrompt, FollowUp, HashPrompt, TokenPrompt, Trace

TOKEN_BLOCK_SIZE = 16


def _blocks(prompt: HashPrompt | TokenPrompt, block_size: int | None) -> list[object]:
    """The prompt's full blocks, as keys comparable across requests of one trace."""
    if isinstance(prompt, HashPrompt):
        assert block_size is not None
        num_full = prompt.num_tokens // block_size
        return [(prompt.namespace, h) for h in prompt.hash_ids[:num_full]]
    ids = prompt.token_ids
    return [
        ids[i : i + TOKEN_BLOCK_SIZE] for i in range(0, len(ids) - TOKEN_BLOCK_SIZE + 1, TOKEN_BLOCK_SIZE)
    ]


def theoretical_hit_rate(trace: Trace, with_answers: bool = False) -> float | None:
    """Hit tokens / prompt tokens with an infinite cache (None for a trace of chat prompts: not known
    before rendering). Prompts only, as published for these traces; `with_answers`: the cache also
    keeps each answer where the session's next prompt repeats it (an engine keeps its output's KV,
    and replayed answers are forced to those tokens), which an engine can reach and the published
    figure does not count."""
    if any(isinstance(t.prompt, ChatPrompt | FollowUp) for s in trace.all_sessions() for t in s.turns):
        return None  # chat prompts, or the model's own answers: tokens known only once sent
    turns = sorted(
        (
            (t, s.turns[i + 1] if i + 1 < len(s.turns) else None)
            for s in trace.all_sessions()
            for i, t in enumerate(s.turns)
        ),
        key=lambda pair: pair[0].t_s,
    )
    seen: set[int] = set()
    hit_tokens = prompt_tokens = 0
    for turn, nxt in turns:
        prompt = turn.prompt
        prompt_tokens += prompt.num_tokens
        if not isinstance(prompt, HashPrompt | TokenPrompt):
            continue
        size = trace.block_size if isinstance(prompt, HashPrompt) else TOKEN_BLOCK_SIZE
        assert size is not None
        key, matching = 0, True
        for block in _blocks(prompt, trace.block_size):
            key = hash((key, block))  # chained: a block's key covers every block before it
            if matching and key in seen:
                hit_tokens += size
            else:
                matching = False
                seen.add(key)
        if with_answers and nxt is not None and type(nxt.prompt) is type(prompt):
            # The next prompt's full blocks within this prompt + answer: in the cache from now on.
            key = 0
            num_blocks = (prompt.num_tokens + turn.max_tokens) // size
            for block in _blocks(nxt.prompt, trace.block_size)[:num_blocks]:  # type: ignore[arg-type]
                key = hash((key, block))
                seen.add(key)
    return hit_tokens / prompt_tokens if prompt_tokens else 0.0
