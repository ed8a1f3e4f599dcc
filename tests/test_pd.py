"""P/D against collocated with real compute: same greedy tokens, same KV; handoff timing and modes."""

import asyncio

import numpy as np
import pytest

from actors.engine.clock import Clock
from actors.engine.kv_connectors.transfer import KVReceiver, LinkQueue
from cluster.virtual import build_deployment, replay_on, run_virtual
from dashboards.headline import failure_reason
from emulation.profiles import LINKS, MODELS
from emulation.transfer import handoff_time
from messages import KVTransferParams
from tests.factories import COLLOCATED, PD, make_config, make_requests, run_async, run_requests

REAL_GREEDY = {"runner": {"compute": "real", "device": "cpu"}, "workload": {"output_policy": "greedy"}}
PROMPTS = make_requests(20, [40 + 17 * i for i in range(20)], 12, seed=7, gap_s=0.3)


def serve_with_spies(cfg, requests, corrupt=False):
    """Serve, recording the KV each request's engine computed (mixed/prefill) and decode received."""
    computed, received = {}, {}

    async def main():
        dep = build_deployment(cfg, Clock())
        for e in dep.engines:
            runner = e.executor.runner
            release = runner.release

            def spy_release(rid, runner=runner, release=release):
                if rid in runner._working:
                    computed.setdefault(rid, runner._working[rid].clone().numpy())
                release(rid)

            runner.release = spy_release
            if e.role == "decode":
                write = runner.write_kv

                def spy_write(block_ids, kv, write=write, engine=e):
                    rid = next(
                        r for r in engine.scheduler.recving.values() if r.block_ids == block_ids
                    ).request_id
                    received[rid] = kv.copy()
                    write(block_ids, np.zeros_like(kv) if corrupt else kv)

                runner.write_kv = spy_write
        return await replay_on(dep, requests)

    return run_async(main()), computed, received


@pytest.fixture(scope="module")
def collocated_run():
    return serve_with_spies(make_config(COLLOCATED, REAL_GREEDY), PROMPTS)


def test_pd_emits_the_same_greedy_tokens_and_moves_the_same_kv(collocated_run):
    colo, colo_kv, _ = collocated_run
    pd, _, received = serve_with_spies(make_config(PD, REAL_GREEDY), PROMPTS)
    assert all(r.finished_reason == "length" for r in colo + pd)
    assert [r.output_token_ids for r in pd] == [r.output_token_ids for r in colo]
    assert sorted(received) == sorted(r.request_id for r in PROMPTS)
    for q in PROMPTS:
        n = len(q.prompt_token_ids)
        kv = received[q.request_id]
        assert kv.shape[3] == n
        np.testing.assert_allclose(kv, colo_kv[q.request_id][:, :, :, :n], rtol=1e-5, atol=1e-6)


def test_prompts_of_one_token_and_at_block_edges_hand_off_too():
    """A 1-token prompt hands off no computed token (decode recomputes the only one) and is pulled once."""
    edges = make_requests(7, [1, 2, 15, 16, 17, 32, 33], 6, seed=3, gap_s=0.2)
    colo, _ = run_requests(make_config(COLLOCATED, REAL_GREEDY), edges)
    pd, _ = run_requests(make_config(PD, REAL_GREEDY), edges)  # engines checked empty: no block leaked
    assert [r.finished_reason for r in pd] == ["length"] * 7
    assert [r.output_token_ids for r in pd] == [r.output_token_ids for r in colo]


def test_corrupted_handoff_changes_tokens(collocated_run):
    """The check above can fail: decode computing on zeroed KV emits different tokens."""
    colo, _, _ = collocated_run
    bad, _, _ = serve_with_spies(make_config(PD, REAL_GREEDY), PROMPTS, corrupt=True)
    differ = sum(a.output_token_ids != b.output_token_ids for a, b in zip(colo, bad, strict=True))
    assert differ >= 15


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_failed_kv_loads_recomputed_on_decode_keep_the_greedy_tokens(collocated_run, mode):
    """Injected KV load failures with load_failure_policy=recompute: decode computes those prompts
    itself; every request still emits collocated's greedy tokens, and the run says how many failed."""
    colo, _, _ = collocated_run
    faults = {"kv_transfer_failure_rate": 0.3, "kv_transfer_failures": [1]}
    kv = {"mode": mode, "load_failure_policy": "recompute"}
    out = run_virtual(make_config(PD, REAL_GREEDY, kv_transfer=kv, faults=faults), PROMPTS)
    df, s = out.results, out.summary
    assert list(df["output_token_ids"].map(list)) == [r.output_token_ids for r in colo]
    assert (df["finished_reason"] == "length").all()
    assert s["num_injected_load_failures"] == s["num_recomputed_loads"] == df["kv_load_failed"].sum() >= 3
    assert (df.loc[df["kv_load_failed"], "prefill_pulled_back_tokens"].fillna(0) == 0).all()
    assert out.engine_reports["prefill-0"].counters.num_expired_handoffs == 0  # told to free, not timed out


def test_failed_kv_loads_fail_their_requests_by_default():
    """vLLM's default policy: a failed load fails its request (with the reason); the rest finish."""
    skip = {"runner": {"compute": "skip"}}
    reqs = make_requests(6, 100, 12, forced=True, gap_s=0.3)
    out = run_virtual(make_config(PD, skip, faults={"kv_transfer_failures": [2, 3]}), reqs)
    df = out.results
    assert list(df["finished_reason"]) == ["length", "error", "error", "length", "length", "length"]
    assert out.summary["failed"] == 2
    reasons = {failure_reason("error", e) for e in df["error"].dropna()}
    assert reasons == {"decode-0 could not load KV: failed on purpose (faults)"}
    assert out.summary["num_injected_load_failures"] == 2 and out.summary["num_recomputed_loads"] == 0


def test_pull_handoff_timing_follows_the_link():
    cfg = make_config(PD, runner={"compute": "skip"}, kv_transfer={"link": "guide-testbox"})
    (r,), _ = run_requests(cfg, make_requests(1, 8192, 8, forced=True))
    expected = handoff_time(8192 * MODELS["qwen2.5-7b"].kv_bytes_per_token, 512, LINKS["guide-testbox"])
    h = r.times.handoff
    assert h.kv_transfer_done_s - h.kv_transfer_start_s == pytest.approx(expected.total_s)
    assert h.kv_transfer_start_s == pytest.approx(r.prefill.prefill_done_s)  # idle decode admits at once
    assert h.kv_noticed_s >= h.kv_transfer_done_s
    first_step = r.token_times_s[0] - h.kv_noticed_s
    assert 0.02 < first_step < 0.03  # one memory-bound decode step computes the last prompt token
    assert r.times.handoff.kv_bytes == 8192 * 57344


def test_busy_decode_notices_only_at_a_step_boundary():
    cfg = make_config(PD, runner={"compute": "skip"}, kv_transfer={"link": "rdma-400g"})
    reqs = make_requests(2, 2048, 200, forced=True, gap_s=1.0)
    results, _ = run_requests(cfg, reqs)
    second = results[1]
    boundaries = set(results[0].token_times_s)
    assert second.times.handoff.kv_noticed_s in boundaries
    assert second.times.handoff.kv_noticed_s > second.times.handoff.kv_transfer_done_s


def test_push_starts_at_prefill_end_and_layerwise_hides_transfer():
    reqs = make_requests(1, 8192, 4, forced=True)
    base = {"runner": {"compute": "skip"}}
    (push,), _ = run_requests(make_config(PD, base, kv_transfer={"link": "pcie4-x16", "mode": "push"}), reqs)
    (lw,), _ = run_requests(
        make_config(PD, base, kv_transfer={"link": "pcie4-x16", "mode": "push", "layerwise": True}), reqs
    )
    assert push.times.handoff.kv_transfer_start_s == pytest.approx(push.prefill.prefill_done_s)
    full = push.times.handoff.kv_transfer_done_s - push.times.handoff.kv_transfer_start_s
    hidden = lw.times.handoff.kv_transfer_done_s - lw.times.handoff.kv_transfer_start_s
    assert hidden == pytest.approx(full / 28)  # prefill compute (>0.7 s) covers the whole transfer
    assert lw.token_times_s[0] < push.token_times_s[0]


@pytest.mark.parametrize(
    ("model", "tp_prefill", "tp_decode", "bytes_per_token", "lanes", "per_lane"),
    [
        ("llama-3.1-70b", 4, 8, 327_680, 4, 2),  # each prefill rank feeds two decode ranks
        ("llama-3.1-70b", 8, 4, 327_680, 4, 2),  # each decode rank reads from two prefill ranks
        ("llama-3.1-70b", 8, 8, 327_680, 8, 1),
        ("qwen2.5-7b", 2, 8, 2 * 57_344, 2, 4),  # 4 KV heads on 8 decode GPUs: each head held twice
    ],
)
def test_a_handoff_between_tp_engines_moves_each_ranks_heads_on_its_own_link(
    model, tp_prefill, tp_decode, bytes_per_token, lanes, per_lane
):
    from emulation.transfer import handoff_time

    cfg = make_config(PD)
    link = LINKS["rdma-400g"]
    rx = KVReceiver(
        cfg.kv_transfer, link=link, model=MODELS[model], block_size=16, tp=tp_decode, peer_tp=tp_prefill
    )
    plan = rx.plan(KVTransferParams(remote_block_ids=tuple(range(512)), remote_engine_id="prefill-0"), 0.0)
    assert plan.kv_bytes == 512 * 16 * bytes_per_token
    assert plan.time == handoff_time(plan.kv_bytes, 512 * per_lane, link, lanes)
    assert plan.time.wire_s == pytest.approx(plan.kv_bytes / (link.bytes_per_s * lanes))


def test_wire_is_shared_fixed_costs_overlap():
    cfg = make_config(PD, kv_transfer={"link": "guide-testbox"})
    rx = KVReceiver(cfg.kv_transfer, link=LINKS["guide-testbox"], model=MODELS["qwen2.5-7b"], block_size=16)
    params = KVTransferParams(remote_block_ids=tuple(range(512)), remote_engine_id="prefill-0")
    link, other = LinkQueue(), LinkQueue()
    a, b, c = (rx.plan(params, 10.0) for _ in range(3))
    a = a.queued(asyncio.run(link.reserve(a.start_s, a.time.wire_s)))
    b = b.queued(asyncio.run(link.reserve(b.start_s, b.time.wire_s)))
    c = c.queued(asyncio.run(other.reserve(c.start_s, c.time.wire_s)))
    assert a.done_s == pytest.approx(10.0 + 1.3, rel=1e-3)
    assert b.done_s - a.done_s == pytest.approx(a.time.wire_s)  # queued behind a's bytes only
    assert c.done_s == pytest.approx(a.done_s)  # another link: no queueing
