"""The prefix cache's index: which block holds the KV of which chained block hash.

Hashes are computed when they can first matter, not as blocks fill (the same cache as vLLM's eager
hashing, at a fraction of the work where prompts share little). A lookup walks a sequence's hashes
from its first block and stops at the first it misses, and a chained hash differs from every other
sequence's unless all blocks before it match too. So blocks a request computes past the prefix it
found cached are published *unhashed* when their first block's hash (their *key*) is nobody else's:
filed under the key alone, and hashed into the cache the moment another lookup reaches that key, or
another publication enters it (or never, if they are reused first)::

    A looks up: hits s0 s1, misses at h2       A publishes key h2, blocks [4 9 2] unhashed
    B looks up: hits s0 s1, misses at h2'      (its own third block: one hash past its hits)
    C looks up: hits s0 s1, h2 is A's key: A's blocks hashed -> cache {h2: 4, h3: 9, h4: 2}, C hits them

Until then nothing else could have met those hashes, so the cache is the same as if they had been
entered as they filled. KV events need every hash at once: with them on, every block is hashed.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat

from actors.engine.kv_cache.block_hash import ROOT_BLOCK_HASH, BlockHash, hash_blocks, prompt_block_hashes
from actors.engine.kv_cache.free_queue import FreeQueue
from actors.engine.request import Request
from messages import BlockRemoved, BlockStored, KVEvents


class PrefixIndex:
    """Full blocks by hash, for the block manager: it shares the manager's free queue (where a freed
    block's entry says whether it was reused) and reference counts (a block entered while its request
    holds it is held once)."""

    def __init__(self, block_size: int, free: FreeQueue, ref_cnt: dict[int, int]) -> None:
        self.block_size = block_size
        self._free = free
        self._ref_cnt = ref_cnt
        self._cached: dict[BlockHash, int] = {}
        """block hash -> block id, for full blocks whose KV is computed."""
        self._hash_of: dict[int, BlockHash] = {}
        """The inverse of `_cached`: the block a hash is cached under, to forget when it is reused."""
        self._unhashed: dict[BlockHash, _Unhashed] = {}
        """key (its first block's hash) -> a sequence of blocks published unhashed; never cached."""
        self._unhashed_of: dict[Request, _Unhashed] = {}
        """A request holding blocks of its unhashed sequence -> that sequence."""
        self._freed_unhashed: deque[_Unhashed] = deque()
        """Unhashed sequences whose blocks are free, in the order freed (dropped once all are reused)."""
        self._events: list[BlockStored | BlockRemoved] | None = None
        """Prefix-cache changes not yet published, in order, when KV events are on."""

    def publish_kv_events(self) -> None:
        """Record every block stored in and evicted from the prefix cache (for a KV-aware router)."""
        for seq in list(self._unhashed.values()):
            self._hash_in(seq)
        self._events = []

    @property
    def publishes_kv_events(self) -> bool:
        return self._events is not None

    def take_kv_events(self) -> KVEvents | None:
        """The changes since the last call, or None (none, or events off)."""
        if not self._events:
            return None
        events = KVEvents(self._events)
        self._events = []
        return events

    def _extend_hashes(self, req: Request, num_tokens: int) -> None:
        """Hash the full blocks among the first `num_tokens` tokens not hashed yet."""
        bs, hashes = self.block_size, req.block_hashes
        num_full = num_tokens // bs
        num_prompt = min(num_full, req.num_prompt_tokens // bs)  # full blocks of prompt alone
        if num_prompt > len(hashes):
            parent = hashes[-1] if hashes else ROOT_BLOCK_HASH
            hashes += prompt_block_hashes(
                req.prompt_token_ids, bs, len(hashes), num_prompt, parent, req.mm_items
            )
        if num_full > len(hashes):
            tokens = req.token_span(len(hashes) * bs, num_full * bs)
            parent = hashes[-1] if hashes else ROOT_BLOCK_HASH
            hashes += hash_blocks(tokens, bs, parent, req.mm_items, len(hashes) * bs)

    def block_hashes(self, req: Request, num_blocks: int) -> list[BlockHash]:
        """The chained hashes of `req`'s first `num_blocks` full blocks (hashed now where they were not
        yet)."""
        self._extend_hashes(req, num_blocks * self.block_size)
        return req.block_hashes[:num_blocks]

    def find(self, req: Request) -> list[int]:
        """The blocks of the longest cached prefix of `req`'s tokens, leaving at least one token to
        compute (the next token needs logits)."""
        bs, hashes, cached = self.block_size, req.block_hashes, self._cached
        max_hit_blocks = (req.num_tokens - 1) // bs
        hits: list[int] = []
        while len(hits) < max_hit_blocks:
            i = len(hits)
            if i == len(hashes):  # hashed in growing runs: a long hit takes few calls, a miss little
                self._extend_hashes(req, min(max_hit_blocks, 2 * i + 1) * bs)
            run = list(map(cached.get, hashes[i:max_hit_blocks]))  # looked up at C speed
            num_hit = run.index(None) if None in run else len(run)
            hits += run[:num_hit]  # type: ignore[arg-type]  # no None before num_hit
            if num_hit == len(run):
                continue
            miss = hashes[i + num_hit]  # a miss, unless it is an unhashed sequence's key
            if (seq := self._unhashed.get(miss)) is None:
                break
            self._hash_in(seq)
            if (block := cached.get(miss)) is None:
                break
            hits.append(block)
        return hits

    def forget(self, blocks: list[int]) -> None:
        """`blocks` left the free queue to be reused: the hashes they were cached under are gone. Every
        per-block step is a builtin's loop (`map`, `dict` methods): a prompt's hundreds of blocks at C
        speed."""
        if self._hash_of:
            gone = list(filter(None, map(self._hash_of.pop, blocks, repeat(None))))
            deque(map(self._cached.__delitem__, gone), maxlen=0)
            if self._events is not None and gone:
                self._events.append(BlockRemoved(gone))
        freed, num_read = self._freed_unhashed, self._free.num_read
        while freed and freed[0].num_live(num_read) == 0:  # every block reused
            if self._unhashed.get(freed[0].key) is freed[0]:
                del self._unhashed[freed[0].key]
            freed.popleft()

    def publish(self, req: Request, num_tokens: int) -> None:
        """Enter the full blocks among `req`'s first `num_tokens` tokens not entered yet: unhashed if
        their key is their own, else hashed (a hash already cached under another block, computed twice
        at once, stays with that block, as `setdefault` would)."""
        num_full = num_tokens // self.block_size
        lo = req.num_published_blocks
        if num_full <= lo:
            return
        new_blocks = req.block_ids[lo:num_full]
        req.num_published_blocks = num_full
        if (seq := self._unhashed_sequence(req, lo)) is not None:
            seq.blocks += new_blocks
            self._unhashed_of[req] = seq
            return
        self._extend_hashes(req, num_full * self.block_size)
        self._enter(dict(zip(req.block_hashes[lo:num_full], new_blocks, strict=True)), held=True)

    def unhashed_start(self, req: Request) -> int | None:
        """`req` is freeing its blocks: where its unhashed sequence starts (blocks it alone holds, never
        cached), or None."""
        seq = self._unhashed_of.get(req)
        return None if seq is None else seq.start

    def freed(self, req: Request, end: int) -> None:
        """`req`'s unhashed sequence is free, its first block's entry just before queue position `end`."""
        seq = self._unhashed_of.pop(req)
        seq.end = end
        self._freed_unhashed.append(seq)

    def _unhashed_sequence(self, req: Request, lo: int) -> _Unhashed | None:
        """Where `req`'s blocks from its `lo`-th on go unhashed: its sequence under way, or a new one
        keyed by block `lo`'s hash; None: they are to be hashed (KV events on, or that hash is cached
        or another sequence's key: computed twice at once, or again after a preemption)."""
        if self._events is not None:
            return None
        seq = self._unhashed_of.get(req)
        if seq is not None:  # a request publishes in order: its blocks continue its sequence
            assert seq.start + len(seq.blocks) == lo
            return seq
        self._extend_hashes(req, (lo + 1) * self.block_size)
        key = req.block_hashes[lo]
        if (other := self._unhashed.get(key)) is not None:
            self._hash_in(other)
            return None
        if key in self._cached:
            return None
        seq = self._unhashed[key] = _Unhashed(req, key, lo)
        return seq

    def _hash_in(self, seq: _Unhashed) -> None:
        """Hash an unhashed sequence's blocks not reused since into the cache."""
        del self._unhashed[seq.key]
        if self._unhashed_of.get(seq.req) is seq:
            del self._unhashed_of[seq.req]
        n = seq.num_live(self._free.num_read)
        self._extend_hashes(seq.req, (seq.start + n) * self.block_size)
        hashes = seq.req.block_hashes[seq.start : seq.start + n]
        self._enter(dict(zip(hashes, seq.blocks[:n], strict=True)), held=seq.end is None)

    def _enter(self, new: dict[BlockHash, int], held: bool) -> None:
        """Cache blocks by hash (`new`: hash -> block), keeping a hash already cached where it is;
        `held`: by the one request that computed them (else they are free). A hash that is an unhashed
        sequence's key was computed there first: that sequence is hashed in first, and keeps it."""
        if self._unhashed:
            for key in new.keys() & self._unhashed.keys():
                if key in self._unhashed:  # (hashing one in may hash in another)
                    self._hash_in(self._unhashed[key])
        for h in new.keys() & self._cached.keys():
            del new[h]
        self._cached.update(new)
        if held:
            self._ref_cnt.update(dict.fromkeys(new.values(), 1))
        self._hash_of.update(zip(new.values(), new.keys(), strict=True))
        if self._events is not None and new:
            self._events.append(BlockStored(list(new)))

    def assert_empty(self) -> None:
        assert not self._unhashed_of, "a request left holding unhashed blocks"


class _Unhashed:
    """A request's blocks published before anything needed their hashes (see the module's docstring),
    in sequence order from its `start`-th block, whose hash is the sequence's `key`.

    Reuse is read off the free queue, not tracked block by block: the request frees its blocks at once,
    tail first, so block i's entry sits at `end - 1 - i`, and the blocks not reused yet are the leading
    ones whose entries the queue has not read::

        blocks  [b0 b1 b2 b3]   freed as entries  b3 b2 b1 b0   ending at `end`
        queue read up to here:                          ^       -> b0 and b1 are still free: 2 live
    """

    __slots__ = ("blocks", "end", "key", "req", "start")

    def __init__(self, req: Request, key: BlockHash, start: int) -> None:
        self.req = req
        self.key = key
        self.start = start
        self.blocks: list[int] = []
        self.end: int | None = None
        """Once its request freed the blocks: one past the position of `blocks[0]`'s queue entry."""

    def num_live(self, num_read: int) -> int:
        """Leading blocks not reused yet, when the free queue has read `num_read` entries."""
        if self.end is None:  # its request holds them
            return len(self.blocks)
        return max(0, min(len(self.blocks), self.end - num_read))
