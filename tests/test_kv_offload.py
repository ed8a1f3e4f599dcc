"""KV offloading: a tier's LRU, pins and store times; an engine's lookups past its GPU prefix hit, loads
while WAITING_FOR_REMOTE_KVS and stores on completion; real KV moving out and back with greedy tokens
unchanged; the router weighing tier hits; vLLM's series; the config's bounds."""

import asyncio

import numpy as np
import pytest

from actors.engine.kv_connectors.tier import KVTier, TierPath
from actors.router import Router
from cluster.config_load import ConfigError
from emulation.config import RouterConfig
from emulation.profiles import LINKS, MODELS
from messages import BlockRemoved, BlockStored, ClientRequest, KVEvents
from tests.factories import COLLOCATED, make_config, run_async, run_requests
from workloads.results import results_frame

BLOCK_BYTES = 1_000_000
KV_PER_TOKEN = MODELS["qwen2.5-7b"].kv_bytes_per_token
PCIE = LINKS["pcie5-host"]


def tier(num_blocks: int = 4) -> KVTier:
    return KVTier("host", num_blocks, TierPath(PCIE, BLOCK_BYTES, lanes=1))


def h(*names: str) -> list[bytes]:
    return [n.encode() for n in names]


def test_a_block_hits_once_its_store_is_done_and_stores_queue_on_one_wire():
    t = tier()
    num, ready_s = t.store(h("a", "b"), [None, None], now=0.0)
    assert num == 2
    wire_s = 2 * BLOCK_BYTES / PCIE.bytes_per_s
    assert ready_s == pytest.approx(wire_s + PCIE.latency_s + PCIE.per_transfer_overhead_s)
    assert t.num_ready(h("a", "b"), now=ready_s / 2) == 0  # being stored: a miss (vLLM's is_ready)
    assert t.num_ready(h("a", "b", "c"), now=ready_s) == 2
    _, second_s = t.store(h("c"), [None], now=0.0)  # queued behind the first store's wire
    assert second_s > ready_s
    assert t.store(h("a", "c"), [None, None], now=1.0) == (0, 1.0)  # held already: nothing moves


def test_lru_evicts_the_least_recently_used_and_never_a_pinned_block():
    t = tier(num_blocks=3)
    t.publish_kv_events()
    t.store(h("a", "b", "c"), [None] * 3, now=0.0)
    t.touch(h("a"))  # b, then c, are now the least recently used
    kvs, done_s = t.load(h("b"), now=1.0)  # pinned while it loads (and touched)
    assert kvs == [None] and done_s > 1.0
    assert t.store(h("d"), [None], now=1.0)[0] == 1  # evicts c (b is pinned, a was touched)
    assert t.num_ready(h("b"), 2.0) == 1 and t.num_ready(h("c"), 2.0) == 0
    t.loaded(h("b"))
    t.assert_consistent()
    events = t.take_kv_events()
    assert [type(e) for e in events] == [BlockStored, BlockRemoved, BlockStored]
    assert events[1].block_hashes == h("c") and {e.medium for e in events} == {"host"}


def test_a_store_that_cannot_fit_is_skipped_whole():
    t = tier(num_blocks=2)
    t.store(h("a", "b"), [None, None], now=0.0)
    t.load(h("a", "b"), now=1.0)  # both pinned
    assert t.store(h("c"), [None], now=1.0) == (0, 1.0)
    assert t.num_skipped_stores == 1 and len(t) == 2
    with pytest.raises(AssertionError, match="pinned"):
        t.assert_consistent()


SHARED = 512  # tokens every prompt starts with
OWN = 1536  # and its own


def _requests(num: int, gap_s: float, output_len: int, seed: int = 0) -> list[ClientRequest]:
    """`num` prompts of 512 shared + 1,536 own tokens, one every `gap_s`; the first comes back last."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, 8192, SHARED).tolist()
    own = [rng.integers(0, 8192, OWN).tolist() for _ in range(num)]
    prompts = [shared + own[i] for i in range(num)] + [shared + own[0]]
    return [
        ClientRequest(f"r{i}", i * gap_s, p, output_len, forced_output_token_ids=list(range(output_len)))
        for i, p in enumerate(prompts)
    ]


def offload_run(host_gb: float, output_len: int = 8):
    """A collocated engine of 260 GPU blocks (4,160 tokens: two prompts' worth), compute skip."""
    cfg = make_config(
        COLLOCATED,
        runner={"compute": "skip"},
        scheduler={"num_gpu_blocks_override": 261, "max_model_len": 2100},
        kv_offload={"host_gb": host_gb},
        workload={"prompt_len": 2048, "output_len": output_len},
    )
    results, _ = run_requests(cfg, _requests(6, 1.0, output_len))  # engines checked empty (every tier too)
    return results_frame(results, "x", 0.0, 0)


def test_a_prompt_evicted_from_gpu_comes_back_from_the_host_tier_after_a_load():
    without, with_host = offload_run(0.0), offload_run(1.0)
    last = with_host.iloc[-1]
    # the GPU cache kept the shared prefix, not r0's own blocks; the host tier has them
    assert without.iloc[-1]["prompt_cached_tokens"] == SHARED
    loaded = OWN - 16  # the last block is computed: its last token's logits give the first token
    assert last["num_cached_tokens"] == SHARED and last["num_host_tokens"] == loaded
    assert last["prompt_cached_tokens"] == SHARED + loaded and last["prompt_offloaded_tokens"] == loaded
    assert last["offload_load_done_s"] > last["offload_load_start_s"] > 0
    assert last["offload_load_bytes"] == loaded * KV_PER_TOKEN
    assert last["ttft_s"] < 0.5 * without.iloc[-1]["ttft_s"]  # 1,520 tokens loaded, not computed
    first = with_host.iloc[0]
    assert first["offload_store_bytes"] == (SHARED + OWN) * KV_PER_TOKEN
    wire_s = first["offload_store_bytes"] / LINKS["pcie4-host"].bytes_per_s  # an L40S's PCIe 4.0
    assert first["offload_store_done_s"] - first["finished_s"] == pytest.approx(wire_s, abs=1e-4)
    assert (with_host["num_host_tokens"].iloc[:-1] == 0).all()


def test_prompt_only_stores_leave_the_answer_out():
    df = offload_run(1.0, output_len=40)
    assert df.iloc[0]["offload_store_bytes"] == (SHARED + OWN) * KV_PER_TOKEN


def test_router_weighs_a_host_hit_below_a_gpu_hit_and_above_a_miss():
    prompt = list(range(64))  # four blocks of 16
    router = Router(3, cfg=RouterConfig(policy="kv_aware"), block_size=16, now=lambda: 0.0)
    from actors.engine.kv_cache.block_hash import prompt_block_hashes

    hashes = prompt_block_hashes(prompt, 16, 0, 4)
    router.on_kv_events(0, KVEvents([BlockStored(hashes[:2])]))
    router.on_kv_events(1, KVEvents([BlockStored(hashes[:3], medium="host")]))
    assert router.pick(ClientRequest("a", 0.0, prompt, 1)) == 1  # 3 x 0.8 > 2 x 1
    router.finished("a")
    router.on_kv_events(1, KVEvents([BlockRemoved(hashes[1:3], medium="host")]))
    assert router.pick(ClientRequest("b", 0.0, prompt, 1)) == 0  # 2 > 0.8
    router.finished("b")
    router.on_kv_events(0, KVEvents([BlockRemoved(hashes[:2])]))
    router.on_kv_events(2, KVEvents([BlockStored(hashes[:1])]))
    assert router.pick(ClientRequest("c", 0.0, prompt, 1)) == 2  # its GPU block: 1 against 0.8
    # c's 5 active blocks on engine 2 outweigh its hit: a host hit beats nothing
    assert router.pick(ClientRequest("d", 0.0, prompt, 1)) == 1


def test_bad_offload_config_is_one_line_naming_field_value_and_bound():
    with pytest.raises(ConfigError, match=r"kv_offload.host_gb=300: .* allowed: 0 to 128"):
        make_config(COLLOCATED, kv_offload={"host_gb": 300})  # an L40S: 1 TB over 8 GPUs
    with pytest.raises(ConfigError, match=r"kv_offload.host_link='x': unknown link; allowed: .*pcie5-host"):
        make_config(COLLOCATED, kv_offload={"host_gb": 1, "host_link": "x"})
    with pytest.raises(ConfigError, match=r"kv_offload: needs scheduler.enable_prefix_caching=True"):
        make_config(COLLOCATED, kv_offload={"host_gb": 1}, scheduler={"enable_prefix_caching": False})


REAL_CHATS = {
    "runner": {"compute": "real", "device": "cpu"},
    "workload": {"kind": "multi_turn", "output_policy": "greedy", "prompt_len": 900, "output_len": 24},
    "multi_turn": {
        "num_conversations": 4,
        "num_turns": "constant:3",
        "common_prefix_tokens": 0,
        "prefix_tokens": "constant:400",
        "user_tokens": "constant:40",
        "output_tokens": "constant:24",
        "think_s": "constant:2",
        "conversation_rate": 10.0,
        "history": "model",
    },
    "scheduler": {"num_gpu_blocks_override": 61, "max_model_len": 960},
}
"""Four chats of three turns, each turn's history the model's own greedy answers, on an engine of 60
GPU blocks (960 tokens: under two chats' worth), so a chat's blocks are gone when its next turn comes."""


def test_greedy_tokens_with_offloaded_kv_equal_those_computed_again():
    """Real compute: every turn's tokens with the host tier (KV stored out as numpy and loaded back into
    other GPU blocks) equal those of the same chats computing their evicted history again."""

    def chats(host_gb: float):
        cfg = make_config(COLLOCATED, REAL_CHATS, kv_offload={"host_gb": host_gb})
        results, _ = run_requests(cfg, None)  # engines checked empty: no request, block or pin left
        return {r.request_id: r for r in results}

    computed, offloaded = chats(0.0), chats(1.0)
    assert computed.keys() == offloaded.keys() and len(computed) == 12
    assert sum(r.times.offload_load.num_host_tokens for r in offloaded.values()) > 0
    assert sum(r.times.offload_load.num_host_tokens for r in computed.values()) == 0
    for rid, r in computed.items():
        assert offloaded[rid].output_token_ids == r.output_token_ids, rid


def test_offload_hits_and_moves_are_counted_in_vllms_series():
    from cluster.virtual import run_virtual
    from dashboards import metrics as m
    from dashboards.exposition import sum_series

    skip = {
        "runner": {"compute": "skip"},
        "workload": {**REAL_CHATS["workload"], "output_policy": "forced"},
        "multi_turn": {**REAL_CHATS["multi_turn"], "history": "generated"},
    }
    out = run_virtual(make_config(COLLOCATED, REAL_CHATS, skip, kv_offload={"host_gb": 1.0}))
    df, expos = out.results, list(out.metrics.values())
    host = df["num_host_tokens"].sum()
    assert host > 0
    assert sum_series(expos, m.PROMPT_TOKENS_CACHED_BY_SOURCE.exposed, source="host") == host
    assert sum_series(expos, m.EXTERNAL_PREFIX_CACHE_HITS.exposed) == host
    assert sum_series(expos, m.KV_OFFLOAD_LOAD_BYTES.exposed) == df["offload_load_bytes"].sum()
    assert sum_series(expos, m.KV_OFFLOAD_STORE_BYTES.exposed) == df["offload_store_bytes"].sum()
    assert sum_series(expos, m.KV_OFFLOAD_LOAD_SIZE.count) == (df["num_host_tokens"] > 0).sum()
    assert 0 < sum_series(expos, m.KV_OFFLOAD_TIER_USAGE.name, tier="host") <= 1


TWO_ENGINES = {"pools": {"mixed": {"replicas": 2}}, "router": {"policy": "round_robin"}}
SHARED_STORE = {"shared_gb": 2.0, "shared_link": "rdma-400g"}


def test_a_prompt_computed_on_one_engine_loads_on_another_from_the_shared_store():
    """Round robin sends r0 to engine 0 and its repeat r6 to engine 0 too (even), so the repeat is r7:
    on engine 1, which never computed it, it loads what engine 0 stored."""
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, 8192, 2048).tolist()
    requests = [ClientRequest("a", 0.0, prompt, 8, forced_output_token_ids=list(range(8)))]
    requests.append(ClientRequest("b", 1.0, prompt, 8, forced_output_token_ids=list(range(8))))
    cfg = make_config(
        TWO_ENGINES,
        runner={"compute": "skip"},
        scheduler={"max_model_len": 2100},
        workload={"prompt_len": 2048, "output_len": 8},
        kv_offload=SHARED_STORE,
    )
    results, _ = run_requests(cfg, requests)  # engines checked empty
    a, b = sorted(results, key=lambda r: r.request_id)
    assert a.engine != b.engine
    assert a.times.offload_load.num_shared_tokens == 0 and b.times.num_cached_tokens == 0
    assert b.times.offload_load.num_shared_tokens == 2048 - 16  # all but its last block
    load = b.times.offload_load
    assert load.offload_load_done_s - load.offload_load_start_s > 0.01  # 1 GB over 50 GB/s


def test_greedy_tokens_through_the_shared_store_equal_those_computed_again():
    """Real compute on two engines taking turns: a chat's next turn lands on the other engine, which
    loads its history from the shared store (numpy through the store) instead of computing it."""

    def chats(kv_offload):
        cfg = make_config(TWO_ENGINES, REAL_CHATS, kv_offload=kv_offload)
        results, _ = run_requests(cfg, None)
        return {r.request_id: r for r in results}

    computed, shared = chats({}), chats(SHARED_STORE)
    assert sum(r.times.offload_load.num_shared_tokens for r in shared.values()) > 0
    for rid, r in computed.items():
        assert shared[rid].output_token_ids == r.output_token_ids, rid


def test_a_shared_store_needs_a_link_and_fits_in_host_memory():
    with pytest.raises(ConfigError, match=r"kv_offload.shared_link=None: a shared store .* allowed: one of"):
        make_config(TWO_ENGINES, kv_offload={"shared_gb": 10})
    with pytest.raises(
        ConfigError, match=r"kv_offload.shared_gb=300: .*host tiers \(200 GB\).* allowed: 0 to 56"
    ):
        make_config(TWO_ENGINES, kv_offload={"host_gb": 100, "shared_gb": 300, "shared_link": "rdma-400g"})


def _store_and_engine_b(store_client=None):
    """A shared store of 4 blocks, engines a and b's sides of it, and b's offloading connector over
    a scheduler of its own (no engine around them); a request of five blocks for b."""
    from actors.engine.kv_cache.coordinator import KVCacheCoordinator
    from actors.engine.kv_connectors.offloading import OffloadingConnector
    from actors.engine.kv_connectors.shared_tier import SharedKVTier
    from actors.engine.request import Request
    from actors.engine.runner.executor import Executor
    from actors.engine.scheduling.scheduler import Scheduler
    from actors.engine.stats import EngineStats
    from actors.kv_store import KVStore
    from messages import EngineRequest

    store = KVStore(num_blocks=4, engine_ids=["a", "b"])
    path = TierPath(LINKS["rdma-400g"], BLOCK_BYTES, lanes=1)
    tiers = {"a": SharedKVTier("a", store, path), "b": SharedKVTier("b", store_client or store, path)}
    blocks = KVCacheCoordinator(64, 16, True)
    offload = OffloadingConnector(
        [tiers["b"]],
        blocks=blocks,
        executor=Executor(None, blocks, vocab_size=8192),
        stats=EngineStats(),
        wake=lambda: None,
    )
    scheduler = Scheduler(blocks, max_num_batched_tokens=2048, max_num_seqs=8, offload=[offload])
    req = Request(EngineRequest("r", list(range(80)), 1, forced_output_token_ids=[0]), 0.0)
    return tiers, scheduler, offload, req


async def _look_up_stored_prompt(tiers, scheduler, offload, req):
    """Engine a stores the request's four blocks; b hears of them and its lookup counts them."""
    hashes = scheduler.blocks.block_hashes(req, 4)
    tiers["a"].store(hashes, [None] * 4, now=0.0)
    await asyncio.sleep(0)  # the put reaches the store
    offload.on_added(req)  # b's view: all four
    await asyncio.sleep(0)
    assert offload.lookup(req, 0, now=1.0) == 4
    return hashes


def test_a_load_from_the_shared_store_stops_where_the_store_evicted_since_the_lookup():
    """Engine b's view still lists blocks another engine's stores have since evicted: its lookup
    counts them, its fetch finds the first gone, so the load ends there (no block of it comes) and
    the request computes those tokens; the view learns of the eviction."""
    tiers, scheduler, offload, req = _store_and_engine_b()

    async def main():
        hashes = await _look_up_stored_prompt(tiers, scheduler, offload, req)
        tiers["a"].store(h("x", "y"), [None, None], now=1.0)  # evicts the first two
        await asyncio.sleep(0)
        assert scheduler.external.allocate_for_load(req, [], 64)
        offload.start_load(req, now=1.0)
        assert offload.get_finished(now=2.0) == []  # its fetch is not back yet
        await asyncio.sleep(0)
        return hashes, offload.get_finished(now=2.0)

    hashes, noticed = run_async(main())
    assert noticed == [req]
    assert req.num_offload_tokens == 0 and req.times.offload_load.num_shared_tokens == 0
    assert tiers["b"].num_ready(hashes, now=2.0) == 0  # it heard of the eviction
    offload.assert_empty()


class _DeadStore:
    """A store whose actor died after the lookup: every call fails."""

    async def get(self, engine_id, hashes):
        raise RuntimeError("actor died")


def test_a_load_whose_store_cannot_be_reached_computes_instead_and_one_ended_meanwhile_is_dropped():
    tiers, scheduler, offload, req = _store_and_engine_b()

    async def load(ends_first: bool):
        await _look_up_stored_prompt(tiers, scheduler, offload, req)
        tiers["b"].kv_store = _DeadStore()
        assert scheduler.external.allocate_for_load(req, [], 64)
        offload.start_load(req, now=1.0)
        if ends_first:  # aborted before its fetch came back: nothing of it is noticed later
            offload.request_finished(req, "abort", now=1.0)
        await asyncio.sleep(0)
        return offload.get_finished(now=2.0)

    assert run_async(load(ends_first=False)) == [req]
    assert req.num_offload_tokens == 0  # it computes the prompt
    offload.assert_empty()
    tiers, scheduler, offload, req = _store_and_engine_b()
    assert run_async(load(ends_first=True)) == []
    offload.assert_empty()
