"""Token IDs held as one array, read as a list of ints is.

A trace's synthesized prompts are drawn as arrays, tens of thousands of tokens each, and in compute
skip their IDs are mostly only hashed: making and freeing a Python int per token was the largest
single cost of replaying one. `TokenIds` keeps the array and makes ints only for what is read: a slice
or a concatenation is a plain list, `bytes_of` the little-endian uint32 bytes block hashes take.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np


class TraceBlocks:
    """How a trace prompt's tokens were made: whole trace blocks of `block_len` tokens, each drawn
    from its hash ID, so prompts whose first k hash IDs (in one namespace) agree agree in their first
    k·block_len tokens, and so in every block hash there. `nodes[i]` names the chain of the prompt's
    hash IDs 0..i (equal chains, one node). `memo`, shared by every prompt of the trace, holds by
    (node, block_size) the chained hashes of the engine blocks inside that chain's last trace block,
    from its start: whichever router or engine hashes them first, in a prompt of any turn, does it
    for all (`block_hash.prompt_block_hashes`)::

        hash IDs     [  7  ][  8  ][  9  ]          nodes   n(7)  n(7,8)  n(7,8,9)
        engine       |..|..|..|..|..|..|..|        memo[(n(7,8), 16)] = hashes of the 4 blocks in 8
    """

    __slots__ = ("block_len", "memo", "nodes")

    def __init__(self, block_len: int, nodes: list[int], memo: dict[tuple[int, int], list[bytes]]) -> None:
        self.block_len = block_len
        self.nodes = nodes
        self.memo = memo


class TokenIds(Sequence[int]):
    """Immutable token IDs over an int32 array; equal to a list (or TokenIds) of the same IDs.
    `trace`: how a trace prompt's IDs were drawn (in process only: a copy sent elsewhere drops it)."""

    __slots__ = ("array", "trace")

    def __init__(self, array: np.ndarray, trace: TraceBlocks | None = None) -> None:
        self.array = np.ascontiguousarray(array, dtype=np.int32)
        self.trace = trace

    def __reduce__(self) -> tuple[type[TokenIds], tuple[np.ndarray]]:
        return (TokenIds, (self.array,))  # the trace's memo is the process's own

    def __len__(self) -> int:
        return len(self.array)

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> list[int]: ...

    def __getitem__(self, i: int | slice) -> int | list[int]:
        return self.array[i].tolist()  # type: ignore[no-any-return]  # an int, or a list of them

    def __iter__(self) -> Iterator[int]:
        return iter(self.array.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenIds):
            return bool(np.array_equal(self.array, other.array))
        if isinstance(other, list):
            return len(other) == len(self.array) and self.array.tolist() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # as a list's

    def __add__(self, other: Sequence[int]) -> list[int]:
        return [*self.array.tolist(), *other]

    def __radd__(self, other: Sequence[int]) -> list[int]:
        return [*other, *self.array.tolist()]

    def __repr__(self) -> str:
        return f"TokenIds({len(self.array)} tokens)"

    def view(self, start: int, end: int) -> TokenIds:
        """IDs [start, end) as TokenIds over the same array (no copy)."""
        return TokenIds(self.array[start:end])

    def startswith(self, prefix: TokenIds) -> bool:
        n = len(prefix.array)
        return len(self.array) >= n and bool(np.array_equal(self.array[:n], prefix.array))


PromptIds = list[int] | TokenIds
"""A prompt's token IDs: a list, or a trace prompt's `TokenIds`."""


def span(token_ids: Sequence[int], start: int, end: int) -> Sequence[int]:
    """`token_ids[start:end]`, a view where they are a `TokenIds` (no int made)."""
    return token_ids.view(start, end) if isinstance(token_ids, TokenIds) else token_ids[start:end]


def bytes_of(token_ids: Sequence[int], start: int, end: int) -> bytes:
    """`token_ids[start:end]` as little-endian uint32s (what block hashes hash), without an int each
    where they are a `TokenIds`."""
    if isinstance(token_ids, TokenIds):
        return token_ids.array[start:end].astype("<u4").tobytes()
    ids = token_ids[start:end]
    return struct.pack(f"<{len(ids)}I", *ids)
