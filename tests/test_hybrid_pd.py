"""Hybrid targets served end to end: P/D hands over the SSM state as of token N-1 beside the KV (prefill
computes the prompt but its last token, decode computes that one), state-aware prefix hits in align mode,
and, with real compute (the tiny Nemotron-H runner), P/D's greedy tokens equal collocated's while the
N variant (`faults.ssm_state_at_n`) diverges."""

from __future__ import annotations

import dataclasses

import pytest

from cluster.config_load import ConfigError
from emulation.profiles import MODELS
from messages import ClientRequest
from tests.factories import COLLOCATED, PD, SIX_TURN, make_config, make_requests, run_requests

GRANITE = MODELS["granite-4.0-h-tiny"]  # 400-token blocks at TP 1: prompts past a block are short here
HYBRID = {"target": {"model": GRANITE.name}}
REAL = {
    "runner": {"compute": "real", "device": "cpu", "architecture": "nemotron_h"},
    "workload": {"output_policy": "greedy"},
}
SKIP = {"runner": {"compute": "skip"}}
PROMPTS = make_requests(6, [30, 399, 400, 401, 650, 900], 8, vocab=128, seed=5, gap_s=0.2)


def repeated(requests: list[ClientRequest], after_s: float) -> list[ClientRequest]:
    """Each request again, `after_s` later (id suffixed "-again")."""
    return [
        dataclasses.replace(r, request_id=r.request_id + "-again", arrival_s=r.arrival_s + after_s)
        for r in requests
    ]


def test_pd_moves_the_state_beside_the_kv_and_prefill_leaves_the_last_token():
    """Each handoff moves 36 states of 806,400 B (bf16, TP 1) whatever the prompt's length, and the KV
    of the blocks of its first N-1 tokens, all prefill computed (400-token blocks of 4 attention layers
    x 2,048 B a token): the 401-token prompt moves one block, not two."""
    cfg = make_config(PD, HYBRID, SKIP)
    assert cfg.scheduler.block_size == 400
    results, _ = run_requests(cfg, make_requests(6, [30, 399, 400, 401, 650, 900], 8, seed=5, forced=True))
    assert all(r.finished_reason == "length" for r in results)
    for r in results:
        n = r.num_prompt_tokens
        assert r.times.handoff.state_bytes == 36 * 806_400
        assert r.times.handoff.kv_bytes == -(-(n - 1) // 400) * 400 * 4 * 2048


def test_repeated_prompts_hit_where_a_state_is_cached():
    """Collocated with prefix caching: a prompt repeated hits its first checkpoint's blocks
    (floor((N - 1) / 400) · 400 tokens); one of a block or less never hits."""
    cfg = make_config(COLLOCATED, HYBRID, SKIP)
    prompts = make_requests(2, [900, 390], 4, seed=1, forced=True)
    results, _ = run_requests(cfg, prompts + repeated(prompts, 5.0))
    cached = {r.request_id: r.times.num_cached_tokens for r in results}
    assert cached == {"r0": 0, "r1": 0, "r0-again": 800, "r1-again": 0}


@pytest.fixture(scope="module")
def collocated_tokens():
    cfg = make_config(COLLOCATED, HYBRID, REAL, scheduler={"enable_prefix_caching": False})
    results, _ = run_requests(cfg, PROMPTS)
    return [r.output_token_ids for r in results]


def test_pd_with_the_state_handoff_equals_collocated(collocated_tokens):
    results, _ = run_requests(make_config(PD, HYBRID, REAL), PROMPTS)  # engines checked empty
    assert all(r.finished_reason == "length" for r in results)
    assert [r.output_token_ids for r in results] == collocated_tokens


def test_prefix_hits_on_cached_states_keep_the_greedy_tokens(collocated_tokens):
    """Each prompt twice, the second after the first finished: the repeats start from the state cached
    at their checkpoint (chunked through the block boundaries) and emit the same tokens."""
    results, _ = run_requests(make_config(COLLOCATED, HYBRID, REAL), PROMPTS + repeated(PROMPTS, 10.0))
    again = [r for r in results if r.request_id.endswith("-again")]
    assert [r.times.num_cached_tokens for r in again] == [0, 0, 0, 400, 400, 800]
    assert [r.output_token_ids for r in again] == collocated_tokens


def test_handing_over_the_state_after_token_n_diverges(collocated_tokens):
    """The deliberate fault: prefill computes all N tokens, decode computes token N again on a state that
    holds it already; the output differs (the check above can fail)."""
    cfg = make_config(PD, HYBRID, REAL, faults={"ssm_state_at_n": True})
    results, _ = run_requests(cfg, PROMPTS)
    got = [r.output_token_ids for r in results]
    assert sum(a != b for a, b in zip(got, collocated_tokens, strict=True)) >= len(PROMPTS) // 2


def test_a_tp_change_moves_what_the_decode_ranks_hold():
    """Prefill TP 1, decode TP 2: each decode rank reads its slice of each sub-projection (vLLM's DS conv
    layout), so the state moved is what decode holds: Granite's single group is replicated over its two
    ranks (conv 3 x 1,792 a rank, vLLM's extra groups), 36 x 403,968 B x 2 ranks."""
    pools = {"mixed": {"replicas": 0}, "prefill": {"replicas": 1}, "decode": {"replicas": 1, "tp": 2}}
    cfg = make_config(HYBRID, SKIP, pools=pools)
    results, _ = run_requests(cfg, make_requests(3, [500, 900, 1300], 4, seed=2, forced=True))
    assert [r.times.handoff.state_bytes for r in results] == [36 * 403_968 * 2] * 3


def test_a_multi_turn_chat_on_hybrid_pd_reuses_each_earlier_prompts_checkpoint():
    """Six turns of one chat: each turn's prefill (its prompt but the last token) hits the state its
    previous turn cached at that prompt's checkpoint, on block multiples only."""
    cfg = make_config(PD, HYBRID, SKIP, workload={"kind": "multi_turn"}, multi_turn=SIX_TURN)
    results, _ = run_requests(cfg, None)
    assert len(results) == 6 and all(r.finished_reason == "length" for r in results)
    hits = [r.prefill.prefill_times.num_cached_tokens for r in results]
    assert hits[0] == 0 and all(h > 0 and h % 400 == 0 for h in hits[1:])


def test_decode_never_computes_on_a_state_it_did_not_get(collocated_tokens):
    """Decode's own cache holding all of a repeat's first N-1 tokens (attention blocks only: decode caches
    no prompt states) falls back to a hit on a cached state, none here, so the KV and state are loaded;
    failed loads recompute from the start (an attention hit has no state); a decode request preempted
    after its load comes back on its own cached state or none. Each way, collocated's tokens."""
    prompts = make_requests(2, [801, 1201], 6, vocab=128, seed=3, gap_s=0.2)
    colo, _ = run_requests(
        make_config(COLLOCATED, HYBRID, REAL, scheduler={"enable_prefix_caching": False}), prompts
    )
    results, dep = run_requests(make_config(PD, HYBRID, REAL), prompts + repeated(prompts, 10.0))
    assert [r.output_token_ids for r in results] == [r.output_token_ids for r in colo] * 2
    assert all(r.times.handoff.state_bytes == 36 * 806_400 for r in results)
    decode = next(e for e in dep.engines if e.role == "decode")
    assert len(decode.scheduler.blocks.pool.state_cache) == 0  # decode loads prompts: it caches no checkpoint
    shared = make_requests(3, [1000, 802, 802], 8, vocab=128, seed=11, gap_s=3.0)
    for r in shared[1:]:
        r.prompt_token_ids[:800] = shared[0].prompt_token_ids[:800]
    colo, _ = run_requests(
        make_config(COLLOCATED, HYBRID, REAL, scheduler={"enable_prefix_caching": False}), shared
    )
    failing = {
        "kv_transfer": {"load_failure_policy": "recompute"},
        "faults": {"kv_transfer_failures": [2, 3]},
    }
    results, _ = run_requests(make_config(PD, HYBRID, REAL, failing), shared)
    assert [r.times.handoff.kv_load_failed for r in results] == [False, True, True]
    assert [r.output_token_ids for r in results] == [r.output_token_ids for r in colo]


def test_a_decode_request_preempted_after_its_load_resumes_on_a_valid_state():
    prompts = make_requests(3, 790, 60, vocab=128, seed=7, gap_s=0.05)
    colo, _ = run_requests(
        make_config(COLLOCATED, HYBRID, REAL, scheduler={"enable_prefix_caching": False}), prompts
    )
    tight = {"num_gpu_blocks_override": 35, "max_model_len": 1200, "reserve_full_isl": False}
    cfg = make_config(PD, HYBRID, REAL, scheduler=tight, workload={"prompt_len": 790, "output_len": 60})
    results, dep = run_requests(cfg, prompts)
    decode = next(e for e in dep.engines if e.role == "decode")
    assert decode.scheduler.num_preemptions >= 1
    assert [r.output_token_ids for r in results] == [r.output_token_ids for r in colo]


def test_a_pool_must_hold_a_requests_states_too():
    """Granite's 9 Mamba groups: a 908-token request needs 3 KV blocks, 9 running-state blocks and 9 for
    its checkpoint; 11 usable blocks cannot admit it (a run would wait for ever), so the config says so."""
    tight = {"num_gpu_blocks_override": 12, "max_model_len": 4000}
    with pytest.raises(ConfigError, match=r"^pools\.mixed: .* KV room for 11 blocks .* a request needs 21;"):
        make_config(COLLOCATED, HYBRID, SKIP, scheduler=tight, workload={"prompt_len": 900, "output_len": 8})
