"""The one scheduler: budget, order, max_num_seqs, preemption, roles at the edges."""

from actors.engine.kv_cache.coordinator import KVCacheCoordinator
from actors.engine.request import Request, RequestStatus
from actors.engine.scheduling.scheduler import Scheduler
from messages import EngineRequest, KVTransferParams


def make(num_blocks=1000, budget=64, max_seqs=8, caching=True):
    return Scheduler(
        KVCacheCoordinator(num_blocks, 16, caching), max_num_batched_tokens=budget, max_num_seqs=max_seqs
    )


def add(s, n_prompt, rid, max_tokens=4, params=None, base=0):
    r = Request(
        EngineRequest(rid, list(range(base, base + n_prompt)), max_tokens, kv_transfer_params=params), 0.0
    )
    s.add(r)
    return r


def step(s, token=1):
    """Schedule and apply one step the way the engine does (every caught-up request emits `token`)."""
    batch = s.schedule(now=0.0)
    for r, n in zip(batch.requests, batch.num_new_tokens, strict=True):
        r.num_computed_tokens += n
        if r.num_computed_tokens == r.num_tokens:
            r.output_token_ids.append(token)
            if len(r.output_token_ids) >= r.max_tokens:
                s.finish(r, "length")
    return batch


def test_chunked_prefill_respects_budget_and_decodes_go_first():
    s = make(budget=64)
    a = add(s, 40, "a")
    b1 = step(s)
    assert b1.num_new_tokens == [40] and a.output_token_ids == [1]
    b = add(s, 200, "b", base=1000)
    b2 = step(s)
    assert b2.requests == [a, b] and b2.num_new_tokens == [1, 63]
    for _ in range(10):
        batch = step(s)
        assert batch.num_scheduled_tokens <= 64
    while s.num_unfinished:
        step(s)
    s.assert_empty()


def test_max_num_seqs_caps_running():
    s = make(budget=1000, max_seqs=2)
    for i in range(4):
        add(s, 10, f"r{i}", base=100 * i)
    batch = step(s)
    assert len(batch.requests) == 2 and len(s.waiting) == 2


def test_preemption_under_kv_pressure_recomputes_and_is_counted():
    s = make(num_blocks=6, budget=256, max_seqs=8, caching=False)
    a = add(s, 40, "a", max_tokens=30)  # 3 blocks now, grows to 5
    b = add(s, 40, "b", max_tokens=30, base=500)
    step(s)
    assert a.status is RequestStatus.RUNNING and b.status is RequestStatus.RUNNING
    while s.num_unfinished:
        step(s)
    assert s.num_preemptions >= 1
    assert b.times.num_preemptions >= 1  # the newest is the victim
    assert len(a.output_token_ids) == 30 and len(b.output_token_ids) == 30
    s.assert_empty()


def test_prefill_role_holds_blocks_until_pulled():
    s = make()
    r = add(s, 40, "p", max_tokens=1, params=KVTransferParams(do_remote_decode=True))
    step(s)
    assert r.status is RequestStatus.FINISHED and "p" in s.held
    assert s.blocks.num_free_blocks == 1000 - 3
    s.release_held("p")
    s.assert_empty()


def test_a_kept_turn_gives_way_to_a_new_request_and_kv_promised_to_a_peer_never_does():
    """Bidirectional: a finished conversation turn decode keeps for a pull back is a cache, released
    (oldest first) when a request finds blocks short; KV held for a peer's pull stays held."""
    s = make(num_blocks=12, budget=256)
    promised = add(s, 64, "p", max_tokens=1, params=KVTransferParams(do_remote_decode=True))
    step(s)
    conversation = KVTransferParams(do_remote_decode=True, do_remote_prefill=True, remote_block_ids=())
    turns = [add(s, 47, f"t{i}", max_tokens=1, params=conversation, base=100 * (i + 1)) for i in range(2)]
    for turn in turns:  # decode's turns: their prompts arrive computed
        step(s)
        s.kv_received(turn)
        step(s)
    assert set(s.held) == {"p", "t0", "t1"} and s.blocks.num_free_blocks == 12 - 4 - 3 - 3
    newcomer = add(s, 64, "n", max_tokens=1, base=5000)  # 4 blocks + 1 to grow: t0 gives way
    step(s)
    assert newcomer.status is not RequestStatus.WAITING
    assert set(s.held) == {"p", "t1"} and promised.block_ids
    assert s.held.release_oldest_turn() and set(s.held) == {"p"}
    assert not s.held.release_oldest_turn() and set(s.held) == {"p"}


def test_decode_role_waits_for_remote_kv_then_recomputes_last_token():
    s = make()
    params = KVTransferParams(do_remote_prefill=True, remote_block_ids=(0, 1, 2))
    r = add(s, 40, "d", max_tokens=3, params=params)
    batch = step(s)
    assert batch.new_remote_requests == [r] and batch.num_scheduled_tokens == 0
    assert r.status is RequestStatus.WAITING_FOR_REMOTE_KVS and len(r.block_ids) == 3
    assert step(s).num_scheduled_tokens == 0  # nothing until the KV is in
    s.kv_received(r)
    batch = step(s)
    assert batch.num_new_tokens == [1] and r.num_computed_tokens == 40 and r.output_token_ids == [1]
    while s.num_unfinished:
        step(s)
    s.assert_empty()


def test_a_waiting_request_is_admitted_only_if_its_whole_prompt_fits_as_vllm_032_does():
    """vLLM 0.32's `scheduler_reserve_full_isl` (its default): a prompt of 10 blocks waits while only 6
    are free, though its first chunk (2 blocks) would fit; without the gate it starts and preempts."""

    def scenario(reserve_full_isl):
        s = Scheduler(
            KVCacheCoordinator(10, 16, True),
            max_num_batched_tokens=32,
            max_num_seqs=8,
            reserve_full_isl=reserve_full_isl,
        )
        a = add(s, 60, "a", max_tokens=8)  # 4 blocks once its prompt and a token are in
        for _ in range(2):
            step(s)
        b = add(s, 160, "b", max_tokens=2, base=1000)  # 10 blocks of 16 tokens
        return s, a, b, step(s)

    s, a, b, batch = scenario(reserve_full_isl=True)
    assert s.blocks.num_free_blocks == 6 and batch.requests == [a] and b.status is RequestStatus.WAITING
    _, _, b_off, batch_off = scenario(reserve_full_isl=False)
    assert b_off in batch_off.requests and b_off.status is RequestStatus.RUNNING


def test_long_prefill_token_threshold_caps_one_request_s_chunk_not_the_step():
    """vLLM's long_prefill_token_threshold: a 200-token prompt runs in chunks of 48 though the budget
    holds 128; a second prompt takes what the first leaves."""
    s = Scheduler(
        KVCacheCoordinator(1000, 16, True),
        max_num_batched_tokens=128,
        max_num_seqs=8,
        long_prefill_token_threshold=48,
    )
    add(s, 200, "a")
    add(s, 100, "b", base=1000)
    assert step(s).num_new_tokens == [48, 48]
    assert step(s).num_new_tokens == [48, 48]


def test_a_data_parallel_attention_replica_holds_its_ranks_limits_and_a_request_runs_on_one_rank():
    """One scheduler for 4 DP attention ranks: 4 ranks' sequences and tokens a step, one rank's budget
    for any one request."""
    from cluster.engines import kv_cache_for, scheduler_for
    from tests.factories import make_config

    cfg = make_config(
        target={"model": "qwen3-30b-a3b"},
        pools={"mixed": {"replicas": 1, "gpu": "h100-sxm", "ep": 4, "dp_attention": True}},
        scheduler={"max_num_batched_tokens": 2048, "max_num_seqs": 64},
    )
    s = scheduler_for(cfg, cfg.pools.mixed, kv_cache_for(cfg, cfg.pools.mixed, "mixed"))
    assert (s.max_num_batched_tokens, s.max_num_seqs, s.max_num_new_tokens) == (8192, 256, 2048)
    add(s, 6000, "long")
    assert step(s).num_new_tokens == [2048]
