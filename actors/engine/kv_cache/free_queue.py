"""The free KV blocks in least-recently-used order (the block manager's eviction order)."""

from __future__ import annotations

import operator
from itertools import repeat


class FreeQueue:
    """The free blocks, least recently used first: those freed without a hash (`push_front`, reused
    first, as vLLM prepends them), then those never used (in id order, not materialised, so a pool of
    any size costs nothing to build), then those freed with one (`push`, oldest first).

    Freed blocks are a list read from `_head` on, so a request's blocks go in and come out by slices (an
    ordered dict costs ~100 ns a block). A block taken out of the middle (a prefix-cache hit on a freed
    block) stays in the list as a stale entry, skipped when its turn comes; it is always older than any
    later entry of the same block, so the first one met is the stale one::

        _queue  [ 7  3  9  3  4 ]      _stale {3: 1}: block 3 was hit, then freed again
                  ^_head                pop_oldest(3) -> [7, 9, 3]
    """

    def __init__(self, num_blocks: int) -> None:
        self._front: list[int] = []
        """Blocks freed without a hash, a stack: its end is the front of the queue."""
        self._next_unused = 0
        self._num_blocks = num_blocks
        self._queue: list[int] = []
        self._head = 0
        self._num_dropped = 0
        """Entries read and dropped from the front of `_queue` (positions count from the first push)."""
        self._stale: dict[int, int] = {}
        """block id -> entries of it in the queue that no longer count (taken out by `remove`)."""
        self._num_stale = 0

    def __len__(self) -> int:
        num_queued = len(self._queue) - self._head - self._num_stale
        return len(self._front) + self._num_blocks - self._next_unused + num_queued

    def pop_oldest(self, count: int) -> list[int]:
        """The `count` least recently used blocks (there must be as many), taken out."""
        front = self._front[len(self._front) - min(count, len(self._front)) :][::-1]
        del self._front[len(self._front) - len(front) :]
        count -= len(front)
        unused = min(count, self._num_blocks - self._next_unused)
        blocks = front + list(range(self._next_unused, self._next_unused + unused))
        self._next_unused += unused
        count -= unused
        if count and not self._num_stale:
            blocks += self._queue[self._head : self._head + count]
            self._head += count
        elif count:
            self._pop_skipping_stale(blocks, count)
        if self._head > 4096 and 2 * self._head > len(self._queue):
            del self._queue[: self._head]
            self._num_dropped += self._head
            self._head = 0
        return blocks

    @property
    def num_read(self) -> int:
        """Entries of freed blocks read so far (taken out, or skipped as stale): an entry pushed at
        position p (`push`) has been read once this passes p."""
        return self._num_dropped + self._head

    def _pop_skipping_stale(self, out: list[int], count: int) -> None:
        queue, stale = self._queue, self._stale
        while count:  # a slice at a time, entry by entry only where it holds stale ones
            chunk = queue[self._head : self._head + count]
            assert chunk, "fewer free blocks than asked for"
            self._head += len(chunk)
            if not any(map(stale.__contains__, chunk)):
                out += chunk
                count -= len(chunk)
                continue
            for block in chunk:
                if stale.get(block):
                    stale[block] -= 1
                    self._num_stale -= 1
                    if not stale[block]:
                        del stale[block]
                else:
                    out.append(block)
                    count -= 1

    def push_front(self, blocks: list[int]) -> None:
        """Free `blocks` that hold nothing findable, to be reused first (`blocks[0]` first of all)."""
        self._front += reversed(blocks)

    def push(self, blocks: list[int]) -> int:
        """Free `blocks`, most recently used last; returns the position of the first one's entry."""
        at = self._num_dropped + len(self._queue)
        self._queue += blocks
        return at

    def remove(self, blocks: list[int]) -> None:
        """Take out freed blocks (each once) that are in use again (prefix-cache hits)."""
        stale = self._stale
        counts = map(operator.add, map(stale.get, blocks, repeat(0)), repeat(1))
        stale.update(zip(blocks, counts, strict=True))
        self._num_stale += len(blocks)
