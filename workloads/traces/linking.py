"""Linking a session's turns so that each prompt is a token prefix of the next where the trace says so.

A hash-ID trace names only blocks: a turn's partial last block has its own ID, and the next turn (whose
prompt continues it with the answer and a new message) has a different ID at that position, for the
block filled up. Synthesised as they stand, the two prompts would part ways at that block and the next
turn could never hit on it. Where the next turn's blocks before that position are the same, the partial
block is the start of the next turn's block: it takes that block's ID (and so its tokens)::

    turn k      [ 3 ][ 4 ][ 9…]         9: partial (num_tokens ends inside it)
    turn k+1    [ 3 ][ 4 ][ 12 ][ 13 ]  same blocks before it
    linked k    [ 3 ][ 4 ][ 12…]        turn k's tokens are the first tokens of turn k+1's
"""

from __future__ import annotations

import dataclasses
import itertools

from workloads.traces.session import HashPrompt, Session


def link_partial_blocks(session: Session, block_size: int) -> None:
    turns = session.turns
    for turn, nxt in itertools.pairwise(turns):
        p, n = turn.prompt, nxt.prompt
        if not (isinstance(p, HashPrompt) and isinstance(n, HashPrompt)) or p.namespace != n.namespace:
            continue
        m = len(p.hash_ids)
        partial = p.num_tokens < m * block_size
        if partial and len(n.hash_ids) >= m and n.hash_ids[: m - 1] == p.hash_ids[: m - 1]:
            turn.prompt = dataclasses.replace(p, hash_ids=(*p.hash_ids[: m - 1], n.hash_ids[m - 1]))
