"""Sessions in closed loop and KV-aware routing (virtual time, compute skip)."""

import itertools

import pytest

from actors.engine.kv_cache.block_hash import hash_blocks
from actors.router import Router
from emulation.config import RouterConfig
from messages import BlockRemoved, BlockStored, ClientRequest, KVEvents
from tests.factories import SIX_TURN, TRACES, make_config, run_requests
from workloads.results import results_frame
from workloads.traces import load_trace
from workloads.traces.prefix_reuse import theoretical_hit_rate
from workloads.traces.session import Session, TokenPrompt, Trace, Turn

SKIP = {"runner": {"compute": "skip"}}
WEKA = TRACES / "weka_claude_code"


def six_turn(replicas, policy):
    cfg = make_config(
        SKIP,
        workload={"kind": "multi_turn"},
        multi_turn=SIX_TURN,
        pools={"mixed": {"replicas": replicas}},
        router={"policy": policy},
    )
    results, _ = run_requests(cfg, None)
    return results_frame(results, policy, 0.0, 0)


def test_six_turn_computes_only_each_new_message_on_one_engine():
    df = six_turn(1, "round_robin")
    assert df["num_prompt_tokens"].tolist() == [4000, 5000, 6000, 7000, 8000, 9000]
    # Turn k holds turn k-1's prompt and answer: all but the answer's last token is cached, in full
    # 16-token blocks: 4,000 + 600 - 1 = 4,599 -> 4,592.
    assert df["num_cached_tokens"].tolist() == [0, 4592, 5584, 6592, 7584, 8592]
    computed = df["num_prompt_tokens"] - df["num_cached_tokens"]
    # the new message, the answer's last token, and the rest of a partial block: ~10 % of turn 1's
    assert (computed[1:] <= 400 + 1 + 15).all() and computed[0] == 4000
    assert df["session_id"].unique().tolist() == ["conv-0000"] and df["turn"].tolist() == list(range(6))


@pytest.mark.parametrize("policy", ["session_affinity", "kv_aware", "kv_estimated"])
def test_two_replicas_round_robin_loses_the_hits_that_affinity_and_kv_routing_keep(policy):
    one = six_turn(1, "round_robin")["num_cached_tokens"].sum()
    rr = six_turn(2, "round_robin")
    assert rr["engine"].nunique() == 2 and rr["num_cached_tokens"].sum() < 0.75 * one
    routed = six_turn(2, policy)
    assert routed["num_cached_tokens"].sum() == one and routed["engine"].nunique() == 1


def test_a_turn_waits_for_the_previous_answer_and_its_think_time():
    df = six_turn(1, "round_robin")
    last_token = df["token_times_s"].map(lambda t: t[-1])
    assert df["arrival_s"].iloc[1:].to_numpy() == pytest.approx(last_token.iloc[:-1].to_numpy() + 1.0)


def _trace_with_subagents():
    def turn(t_s, think_s=0.0, subagents=()):
        return Turn(TokenPrompt(tuple(range(1, 200))), 8, t_s, think_s=think_s, subagents=list(subagents))

    subs = [Session(f"p/sub{i}", [turn(10.0), turn(11.0, think_s=0.5)], parent="p") for i in range(2)]
    parent = Session("p", [turn(0.0, subagents=subs), turn(30.0, think_s=2.0)])
    return Trace("t", [parent])


@pytest.mark.parametrize("timing", ["think", "original"])
def test_subagents_run_together_and_the_parent_waits_for_all(timing):
    cfg = make_config(SKIP, replay={"timing": timing})
    results, _ = run_requests(cfg, _trace_with_subagents())
    by = {r.request_id: r for r in results}
    first_done = by["p#0"].token_times_s[-1]
    assert by["p/sub0#0"].arrival_s == by["p/sub1#0"].arrival_s == pytest.approx(first_done)
    subs_done = max(by[f"p/sub{i}#1"].token_times_s[-1] for i in range(2))
    second = by["p#1"].arrival_s
    if timing == "think":
        assert by["p/sub0#1"].arrival_s == pytest.approx(by["p/sub0#0"].token_times_s[-1] + 0.5)
        assert second == pytest.approx(subs_done + 2.0)
    else:  # the trace's own time (30 s) is later than everything before it
        assert second == pytest.approx(30.0) and subs_done < 30.0
    assert by["p/sub1#0"].parent_session_id == "p" and by["p#1"].turn == 1


def test_window_and_session_cap():
    sessions = [Session(f"s{i}", [Turn(TokenPrompt(tuple(range(i, i + 100))), 4, 5.0 * i)]) for i in range(6)]
    cfg = make_config(SKIP, replay={"window_s": [10.0, 25.0], "max_sessions": 1})
    results, _ = run_requests(cfg, Trace("t", sessions))
    assert [r.session_id for r in results] == ["s2", "s3", "s4"]
    assert results[0].arrival_s == 0.0  # shifted to the window's start
    for a, b in itertools.pairwise(results):  # one at a time
        assert b.arrival_s >= a.token_times_s[-1]


def _req(rid, tokens, max_tokens=4):
    return ClientRequest(rid, 0.0, list(tokens), max_tokens)


def test_kv_aware_router_follows_events_and_counts_active_blocks():
    router = Router(2, cfg=RouterConfig(policy="kv_aware"), block_size=16, now=lambda: 0.0)
    prompt = list(range(64))  # 4 blocks
    first = router.pick(_req("a", prompt))
    router.finished("a")
    hashes = hash_blocks(prompt, 16)
    other = 1 - first
    router.on_kv_events(other, KVEvents([BlockStored(hashes)]))
    assert router.pick(_req("b", prompt + [1] * 16)) == other  # 4 blocks to prefill fewer there
    router.finished("b")
    router.on_kv_events(other, KVEvents([BlockRemoved(hashes[2:])]))  # evicted: 2 blocks left
    router.on_kv_events(first, KVEvents([BlockStored(hashes[:3])]))
    assert router.pick(_req("c", prompt)) == first


def test_kv_estimated_router_forgets_after_its_ttl():
    now = [0.0]
    router = Router(
        2, cfg=RouterConfig(policy="kv_estimated", estimate_ttl_s=10.0), block_size=16, now=lambda: now[0]
    )
    prompt = list(range(160))
    first = router.pick(_req("a", prompt))
    router.finished("a")
    assert router.pick(_req("b", prompt)) == first
    router.finished("b")
    now[0] = 50.0  # both entries expired: a tie, broken round robin
    picks = {router.pick(_req(f"c{i}", prompt)) for i in range(2)}
    assert picks == {0, 1}


def test_weka_on_four_replicas_kv_aware_reaches_the_traces_reuse_and_round_robin_does_not():
    trace = load_trace(WEKA)
    theoretical = theoretical_hit_rate(trace)
    rates, ttft = {}, {}
    for policy in ("round_robin", "kv_aware"):
        cfg = make_config(
            SKIP,
            target={"model": "llama-3.1-8b"},
            pools={"mixed": {"replicas": 4, "gpu": "h200"}},
            scheduler={"max_model_len": 262144},
            router={"policy": policy},
        )
        results, _ = run_requests(cfg, trace)
        df = results_frame(results, policy, 0.0, 0)
        assert df["ok"].all() and len(df) == 551
        rates[policy] = df["num_cached_tokens"].sum() / df["num_prompt_tokens"].sum()
        ttft[policy] = df["ttft_s"].median()
    assert abs(rates["kv_aware"] - theoretical) < 0.10
    assert rates["kv_aware"] > rates["round_robin"] + 0.05 and ttft["kv_aware"] < ttft["round_robin"]


def test_router_temperature_samples_by_seed_and_favours_the_cheaper_engine():
    def picks(seed):
        router = Router(
            2, cfg=RouterConfig(policy="kv_aware", temperature=0.5), block_size=16, now=lambda: 0.0, seed=seed
        )
        prompt = list(range(320))  # 20 blocks, all held by engine 1
        router.on_kv_events(1, KVEvents([BlockStored(hash_blocks(prompt, 16))]))
        out = []
        for i in range(200):
            out.append(router.pick(_req(f"r{i}", prompt, max_tokens=1)))
            router.finished(f"r{i}")
        return out

    a = picks(0)
    assert a == picks(0) and a != picks(1)  # deterministic for a seed
    assert 0.6 < sum(a) / len(a) < 1.0  # softmax: mostly the engine holding the prefix, not always
