"""Where the blocks of the next steps come from, counted ahead (a window of steps: the scheduler's
next `num_steps` schedules of one batch, each request decoding a token a step but perhaps the last,
which computes a prompt chunk a step).

A step computes each request's next tokens, whose positions need blocks once they lie past the blocks
held (`allocate_new_blocks`). Step i (0-based) of a decode computes position `num_computed + i`::

    held:      |■ ■ ■ ■|■ ■ □ □|              block_size 4, 6 positions computed, 2 blocks held
    step:                  0 1 2 3 4 5 6 7 8 9
    new block:                 ^ step 2         then every block_size steps: 6, 10, ...

The chunked request needs, at each step, what its chunks so far reach past the blocks it holds."""

from __future__ import annotations

from actors.engine.request import Request


def num_new_blocks(requests: list[Request], chunks: list[int], block_size: int, num_steps: int) -> int:
    """The blocks of full attention the steps after the first take (see `new_block_runs`)."""
    firsts = _first_new_blocks(requests, chunks, block_size)
    num = sum(len(range(first, num_steps, block_size)) for first in firsts)
    if chunks:
        num += sum(_chunk_new_blocks(requests[-1], chunks, block_size, num_steps)[1])
    return num


def new_block_runs(
    requests: list[Request], chunks: list[int], block_size: int, num_steps: int
) -> list[tuple[int, int, int]]:
    """The blocks the steps after the first take, as runs in the order a step at a time takes them
    (step by step, then the batch's order): (step, request index, block count). A decode takes one at
    its first step and every `block_size` steps after; the chunked request one run a step, what its
    chunk reaches past the blocks it holds (hundreds of blocks: listed as one). `chunks`: the last
    request's prompt chunk each step (none: decodes only)."""
    firsts = _first_new_blocks(requests, chunks, block_size)
    if not chunks and all(f <= block_size for f in firsts):
        # Decodes only, each starting within the first `block_size` steps: every round of that many
        # steps allocates in the same order (by first step, then the batch's), the last one cut short.
        order = sorted(range(len(firsts)), key=lambda r: (firsts[r], r))
        out = []
        for base in range(0, num_steps, block_size):
            out += [(base + firsts[r], r, 1) for r in order if base + firsts[r] < num_steps]
        return out
    out = [(i, r, 1) for r, first in enumerate(firsts) for i in range(first, num_steps, block_size)]
    if chunks:
        steps, sizes = _chunk_new_blocks(requests[-1], chunks, block_size, num_steps)
        out += [(i, len(requests) - 1, n) for i, n in zip(steps, sizes, strict=True)]
    return sorted(out)  # (step, request) pairs are distinct: counts are never compared


def _first_new_blocks(requests: list[Request], chunks: list[int], block_size: int) -> list[int]:
    """Each decode's first step (after the first) that needs a new block."""
    decodes = requests[:-1] if chunks else requests
    return [max(1, len(req.block_ids) * block_size - req.num_computed_tokens) for req in decodes]


def _chunk_new_blocks(
    req: Request, chunks: list[int], block_size: int, num_steps: int
) -> tuple[list[int], list[int]]:
    """The steps (after the first) at which the chunked request needs blocks, and how many."""
    steps, sizes = [], []
    held, computed = len(req.block_ids), req.num_computed_tokens + chunks[0]
    for i in range(1, num_steps):
        computed += chunks[i]
        need = -(-computed // block_size) - held
        if need > 0:
            steps.append(i)
            sizes.append(need)
            held += need
    return steps, sizes
