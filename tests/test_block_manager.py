"""KV blocks and the prefix cache: chained hashes, hits, LRU eviction, nothing leaked."""

import os
import random
import subprocess
import sys

from actors.engine.kv_cache.block_hash import hash_blocks
from actors.engine.kv_cache.coordinator import KVCacheCoordinator
from actors.engine.request import Request
from messages import EngineRequest


def req(tokens, rid="a", max_tokens=4):
    return Request(EngineRequest(rid, list(tokens), max_tokens), 0.0)


def admit(bm: KVCacheCoordinator, r: Request) -> int:
    """Look `r` up and take its prefix hit, as the scheduler admits it: the tokens the hit covers."""
    hits = bm.get_computed_blocks(r)
    r.num_computed_tokens = len(hits) * bm.block_size
    assert bm.allocate_slots(r, 0, hits)
    bm.record_prefix_cache_stats(r, r.num_computed_tokens)
    return r.num_computed_tokens


def compute_all(bm: KVCacheCoordinator, r: Request) -> None:
    """Allocate and 'compute' every prompt token (full blocks are published as they are allocated)."""
    assert bm.allocate_slots(r, r.num_tokens - r.num_computed_tokens)
    r.num_computed_tokens = r.num_tokens


def test_repeated_prompt_hits_all_but_the_last_token():
    bm = KVCacheCoordinator(64, 16, True)
    a = req(range(64), "a")
    assert admit(bm, a) == 0
    compute_all(bm, a)
    bm.free(a)
    b = req(range(64), "b")
    # 64 tokens = 4 full blocks, but one token must be computed for logits: 3 blocks hit
    assert admit(bm, b) == 48
    assert bm.num_prefix_cache_hits == 48
    assert bm.num_prefix_cache_queries == 128
    compute_all(bm, b)
    bm.free(b)
    bm.assert_empty()


def test_changed_history_changes_every_later_hash():
    bm = KVCacheCoordinator(64, 16, True)
    a = req(range(80), "a")
    compute_all(bm, a)
    bm.free(a)
    changed = list(range(80))
    changed[20] = 999  # inside block 1
    b = req(changed, "b")
    assert admit(bm, b) == 16  # block 0 only; blocks 2.. share tokens but not history
    bm.free(b)
    ha, hb = bm.block_hashes(a, 4), bm.block_hashes(b, 4)
    assert ha[0] == hb[0]
    assert all(ha[i] != hb[i] for i in range(1, 4))
    bm.assert_empty()


def test_shared_prefix_is_referenced_not_copied():
    bm = KVCacheCoordinator(64, 16, True)
    a = req(range(40), "a")
    compute_all(bm, a)
    b = req([*range(32), 7, 7, 7, 7], "b")
    assert admit(bm, b) == 32
    assert b.block_ids[:2] == a.block_ids[:2]
    free_before = bm.num_free_blocks
    bm.free(a)
    assert bm.num_free_blocks == free_before + 1  # the shared two stay referenced by b
    bm.free(b)
    bm.assert_empty()


def test_lru_eviction_reuses_oldest_free_block_and_forgets_its_hash():
    bm = KVCacheCoordinator(4, 16, True)
    a = req(range(33), "a")  # 3 blocks, 2 full
    compute_all(bm, a)
    bm.free(a)
    big = req(range(1000, 1064), "big")  # needs all 4 blocks: evicts a's cached blocks
    assert admit(bm, big) == 0
    assert bm.allocate_slots(big, 64)
    bm.free(big)
    again = req(range(33), "again")
    assert admit(bm, again) == 0
    bm.free(again)
    bm.assert_empty()


def test_allocation_fails_cleanly_when_short():
    bm = KVCacheCoordinator(2, 16, False)
    r = req(range(40))
    assert not bm.allocate_slots(r, 40)
    assert r.block_ids == [] and bm.num_free_blocks == 2


def test_prefix_caching_off_never_hits():
    bm = KVCacheCoordinator(16, 16, False)
    a = req(range(64))
    compute_all(bm, a)
    bm.free(a)
    assert admit(bm, req(range(64), "b")) == 0


def test_block_hashes_are_the_same_in_every_process():
    """A router compares hashes computed in other actors: Python's salted `hash` would differ."""
    tokens = list(range(1000, 1100))
    script = (
        "from actors.engine.kv_cache.block_hash import hash_blocks; "
        f"print(','.join(h.hex() for h in hash_blocks({tokens}, 16)))"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert runs == {",".join(h.hex() for h in hash_blocks(tokens, 16))}
    assert len(hash_blocks(tokens, 16)) == 6  # full blocks only


def test_a_block_hash_chains_over_everything_before_it():
    a = hash_blocks(list(range(64)), 16)
    b = hash_blocks([99, *range(1, 64)], 16)
    assert all(x != y for x, y in zip(a, b, strict=True))  # one changed token changes every later hash
    assert hash_blocks(list(range(32, 64)), 16, parent=a[1]) == a[2:]  # resumable from any block


def test_a_next_turn_is_hashed_one_block_past_the_prefix_it_shares():
    bm = KVCacheCoordinator(64, 16, True)
    a = req(range(100), "a")
    compute_all(bm, a)  # its 6 full blocks, unhashed under their first
    bm.free(a)
    b = req([*range(100), *range(500, 900)], "b")  # a's prompt, then its own (31 blocks in all)
    assert admit(bm, b) == 96  # a's blocks hashed in and hit
    compute_all(bm, b)  # published unhashed from block 6 on, under block 6's hash
    assert len(b.block_hashes) == 7  # hashed in runs of 1, 3, 7 blocks: to block 6, its first miss
    bm.free(b)
    c = req([*range(100), *range(500, 900), 1], "c")
    assert admit(bm, c) == 496  # b's blocks hashed in when c's walk reached their key
    bm.free(c)
    bm.assert_empty()


def test_a_prompt_sharing_nothing_is_hashed_only_at_its_first_block():
    bm = KVCacheCoordinator(64, 16, True)
    a = req(range(160), "a")
    assert admit(bm, a) == 0
    compute_all(bm, a)
    assert len(a.block_hashes) == 1  # published under its first block's hash alone
    bm.free(a)
    b = req([*range(100), 7, 7], "b")  # the same first block: a's blocks are hashed in, then hit
    assert admit(bm, b) == 96
    assert len(a.block_hashes) == 10
    bm.free(b)
    bm.assert_empty()


def _random_ops(seed: int, events: bool) -> list[object]:
    """A random mix of requests on a small cache (shared prefixes, evictions, preemptions), with
    everything the block manager answers along the way."""
    rng = random.Random(seed)
    bm = KVCacheCoordinator(32, 4, True)
    if events:
        bm.publish_kv_events()
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(1, 30))] for _ in range(4)]
    running: list[Request] = []
    done: list[list[int]] = []
    seen: list[object] = []
    for i in range(300):
        op = rng.random()
        if op < 0.35 or not running:
            tail = [rng.randrange(50) for _ in range(rng.randrange(1, 20))]
            # a shared prefix, or a whole earlier prompt (a next turn: it diverges deep in a sequence)
            head = rng.choice([*prefixes, [], *done[-3:]])
            r = req(head + tail, f"r{i}")
            seen.append(("hit", admit(bm, r), list(r.block_ids)))
            running.append(r)
        elif op < 0.8:  # compute a chunk
            r = rng.choice(running)
            n = min(rng.randrange(1, 12), r.num_tokens - r.num_computed_tokens)
            ok = n > 0 and bm.allocate_slots(r, n)
            if ok:
                r.num_computed_tokens += n
            seen.append(("step", ok, list(r.block_ids), bm.num_free_blocks))
        else:  # finish (or be preempted: the same request comes back and looks up again)
            r = running.pop(rng.randrange(len(running)))
            bm.free(r)
            done.append(r.token_ids(0, r.num_tokens))
            if rng.random() < 0.5:
                r.num_computed_tokens = 0
                seen.append(("again", admit(bm, r), list(r.block_ids)))
                running.append(r)
    for r in running:
        bm.free(r)
    bm.assert_empty()
    return seen


def test_hashing_when_needed_gives_the_cache_of_hashing_as_blocks_fill():
    """KV events make every block hashed as it fills; without them hashes wait for a lookup to
    need them. Every answer, over random runs with sharing, eviction and preemption, is the same."""
    for seed in range(100):
        assert _random_ops(seed, events=False) == _random_ops(seed, events=True)


def test_blocks_are_cached_as_they_are_allocated():
    """vLLM caches the full blocks a step will compute as it schedules them: a request admitted later
    in the same step hits them."""
    bm = KVCacheCoordinator(16, 16, True)
    a = req(range(40), "a")
    assert admit(bm, a) == 0 and bm.allocate_slots(a, 40)  # scheduled, not computed yet
    b = req(range(40), "b")
    assert admit(bm, b) == 32 and b.block_ids[:2] == a.block_ids[:2]
    for r in (a, b):
        bm.free(r)
    bm.assert_empty()


def test_blocks_without_a_hash_are_reused_first():
    """vLLM prepends freed blocks without a hash (here a partly filled last block) to the free queue
    and appends hashed ones: the next allocation takes the partial block, the cached prefix stays."""
    bm = KVCacheCoordinator(2, 16, True)
    a = req(range(20), "a")
    compute_all(bm, a)  # block 0 full and cached, block 1 partial
    bm.free(a)
    other = req(range(100, 110), "other")
    assert admit(bm, other) == 0 and bm.allocate_slots(other, 10)
    assert admit(bm, req(range(20), "again")) == 16  # not evicted
    bm.free(other)


def test_a_request_that_does_not_fit_leaves_its_hit_where_it_was():
    """vLLM checks the fit (a free hit block counts as one to take) before touching the hit: a failed
    admission does not make its hit the most recently used."""
    bm = KVCacheCoordinator(3, 16, True)
    old, new = req(range(17), "old"), req(range(100, 117), "new")
    for r in (old, new):  # cached in this order: old is the least recently used
        compute_all(bm, r)
        bm.free(r)
    big = req([*range(16), *range(500, 600)], "big")  # hits old's block, needs 8 in all
    hits = bm.get_computed_blocks(big)
    big.num_computed_tokens = 16
    assert hits and not bm.allocate_slots(big, 100, hits)
    assert big.block_ids == [] and bm.num_free_blocks == 3
    two = req(range(900, 932), "two")
    assert bm.allocate_slots(two, 32)  # a free block without a hash, then the oldest cached: old's
    assert admit(bm, req(range(17), "old-again")) == 0
    assert admit(bm, req(range(100, 117), "new-again")) == 16
