"""A trace's prompts hash each shared block once in a run (`TraceBlocks` memo), to the same bytes as
hashing their tokens; routers and engines read the same memo; KV events apply in order."""

import pickle

import pytest

import actors.engine.kv_cache.block_hash as block_hash
from actors.engine.kv_cache.block_hash import ROOT_BLOCK_HASH, hash_blocks, prompt_block_hashes
from actors.router import Router
from cluster.config_load import load_designs
from cluster.engines import kv_cache_for
from emulation.config import RouterConfig
from messages import BlockRemoved, BlockStored, KVEvents
from messages.token_ids import TokenIds
from workloads.traces.session import HashPrompt
from workloads.traces.tokens import TokenSynthesizer


@pytest.fixture
def num_hashed(monkeypatch):
    """Blocks hashed by `hash_blocks` since the test began."""
    count = [0]
    plain = block_hash.hash_blocks

    def counting(*args, **kwargs):
        out = plain(*args, **kwargs)
        count[0] += len(out)
        return out

    monkeypatch.setattr(block_hash, "hash_blocks", counting)
    return count


def _prompts(synth: TokenSynthesizer) -> list[TokenIds]:
    """Turns sharing prefixes of 64-token trace blocks, cut mid-block; another namespace; a salt."""
    specs = [((1, 2, 3), 180), ((1, 2, 3, 4), 250), ((1, 2, 9), 150), ((1, 2, 3, 4, 5), 320)]
    out = [synth.tokens(HashPrompt(ids, n, "t")) for ids, n in specs]
    out.append(synth.tokens(HashPrompt((1, 2, 3), 192, "other")))
    out.append(synth.tokens(HashPrompt((1, 2, 3), 192, "t"), salt="/user"))
    return out  # type: ignore[return-value]  # hash prompts: TokenIds


def test_memo_gives_the_hashes_of_the_tokens(num_hashed):
    synth = TokenSynthesizer(8192, 64)
    prompts = _prompts(synth)
    for block_size in (16, 32, 64):  # trace blocks hold whole engine blocks
        for tokens in prompts:
            n = len(tokens) // block_size
            for lo, hi in [(n // 2 + 1, n), (1, n), (0, 1), (0, n), (n - 1, n)]:  # mid-block first
                parent = ROOT_BLOCK_HASH if lo == 0 else hash_blocks(list(tokens), block_size)[lo - 1]
                expected = hash_blocks(list(tokens)[lo * block_size : hi * block_size], block_size, parent)
                assert prompt_block_hashes(tokens, block_size, lo, hi, parent) == expected
    num_hashed[0] = 0
    for tokens in prompts:  # all known by now: nothing hashed again
        prompt_block_hashes(tokens, 16, 0, len(tokens) // 16)
    assert num_hashed[0] == 0


def test_each_shared_block_is_hashed_once(num_hashed):
    synth = TokenSynthesizer(8192, 64)
    turns = [synth.tokens(HashPrompt(tuple(range(1, k + 1)), 64 * k, "t")) for k in (2, 4, 6)]
    for tokens in turns:
        prompt_block_hashes(tokens, 16, 0, len(tokens) // 16)
    assert num_hashed[0] == 6 * 4  # the longest turn's blocks, once
    other = TokenSynthesizer(8192, 40)  # engine blocks straddle its trace blocks: hashed as tokens
    tokens = other.tokens(HashPrompt((1, 2), 80, "t"))
    assert prompt_block_hashes(tokens, 16, 0, 5) == hash_blocks(list(tokens), 16)


def test_trace_ids_cross_actors_without_the_memo():
    synth = TokenSynthesizer(8192, 64)
    tokens = synth.tokens(HashPrompt((1, 2), 128, "t"))
    assert isinstance(tokens, TokenIds) and tokens.trace is not None
    copy = pickle.loads(pickle.dumps(tokens))
    assert copy == tokens and copy.trace is None


def test_router_applies_events_in_order():
    router = Router(2, cfg=RouterConfig(policy="kv_aware"), block_size=16, now=lambda: 0.0)
    hashes = hash_blocks(list(range(64)), 16)
    router.on_kv_events(0, KVEvents([BlockStored(hashes), BlockRemoved(hashes[1:]), BlockStored(hashes[3:])]))
    assert router._overlap(0, hashes) == 1 and router._held[0] == {hashes[0], hashes[3]}


def test_only_pools_a_kv_aware_router_reads_publish_events():
    cfg = load_designs("guide-l40s", ["pd-testbox"], ["router.policy=kv_aware"])[0]
    policy = cfg.router.policy_for
    assert policy("prefill") == "kv_aware" and policy("decode") == "least_loaded"
    assert kv_cache_for(cfg, cfg.pools.prefill, "prefill").publishes_kv_events
    assert not kv_cache_for(cfg, cfg.pools.decode, "decode").publishes_kv_events
