"""The KV handoff as NIXL does it (virtual time, compute skip): when prefill frees, what moves, and
where the time goes."""

import numpy as np
import pytest

from actors.engine.clock import Clock
from cluster.virtual import build_deployment, replay_on, run_virtual
from emulation.kv_cache import cdiv
from emulation.profiles import LINKS, MODELS
from messages import ClientRequest, EngineRequest, KVTransferParams
from messages.latency import HANDOFF_PARTS
from tests.factories import COLLOCATED, PD, make_config, make_requests, run_async
from workloads.results import results_frame
from workloads.summary import summarize

SKIP = {"runner": {"compute": "skip"}}


def serve_recording_frees(cfg, requests):
    """Serve `requests`; also the emulated time each prefill engine freed each request's held KV."""
    freed = {}

    async def main():
        dep = build_deployment(cfg, Clock())
        for e in dep.engines:
            if e.role == "prefill":
                release = e.scheduler.release_held

                def spy(rid, release=release, clock=e.clock):
                    freed.setdefault(rid, clock.now())
                    return release(rid)

                e.scheduler.release_held = spy
        return await replay_on(dep, requests)

    return run_async(main()), freed


def test_prefill_holds_its_kv_until_decode_noticed_the_transfer():
    cfg = make_config(PD, SKIP, kv_transfer={"link": "guide-testbox"})
    results, freed = serve_recording_frees(cfg, make_requests(3, 4096, 8, forced=True, gap_s=0.5))
    for r in results:
        h = r.times.handoff
        assert h.kv_transfer_done_s - h.kv_transfer_start_s > 0.5  # the testbox link: most of a second
        assert freed[r.request_id] >= h.kv_noticed_s >= h.kv_transfer_done_s


def test_two_decodes_pulling_from_one_prefill_queue_on_its_link():
    """Two prompts finish in one prefill step; two decode engines pull them at once over the prefill
    engine's link: the second transfer waits for the first one's bytes (fixed costs overlap)."""
    cfg = make_config(
        {"pools": {"mixed": {"replicas": 0}, "prefill": {"replicas": 1}, "decode": {"replicas": 2}}},
        SKIP,
        kv_transfer={"link": "pcie4-x16"},
    )
    (a, b), _ = serve_recording_frees(cfg, make_requests(2, 1008, 4, forced=True, gap_s=0.0))
    assert a.engine != b.engine and a.prefill.prefill_done_s == b.prefill.prefill_done_s
    ta, tb = a.times.handoff, b.times.handoff
    assert ta.kv_transfer_start_s == tb.kv_transfer_start_s
    wire_s = 1008 * MODELS["qwen2.5-7b"].kv_bytes_per_token / LINKS["pcie4-x16"].bytes_per_s
    first, second = sorted((ta.kv_transfer_done_s, tb.kv_transfer_done_s))
    assert second - first == pytest.approx(wire_s)


@pytest.mark.parametrize("link_scope", ["prefill", "fabric"])
def test_on_a_shared_fabric_pulls_from_two_prefill_engines_queue(link_scope):
    """Two prefill engines finish a prompt each at once; two decode engines pull them at once. Each
    prefill engine's own link: both wires start together; one fabric: the second waits for the first's
    bytes."""
    two_by_two = {"mixed": {"replicas": 0}, "prefill": {"replicas": 2}, "decode": {"replicas": 2}}
    cfg = make_config(SKIP, pools=two_by_two, kv_transfer={"link": "pcie4-x16", "link_scope": link_scope})
    (a, b), _ = serve_recording_frees(cfg, make_requests(2, 1008, 4, forced=True, gap_s=0.0))
    ta, tb = a.times.handoff, b.times.handoff
    assert a.prefill.prefill_engine != b.prefill.prefill_engine
    assert ta.kv_transfer_start_s == tb.kv_transfer_start_s
    wire_s = 1008 * MODELS["qwen2.5-7b"].kv_bytes_per_token / LINKS["pcie4-x16"].bytes_per_s
    first, second = sorted((ta.kv_wire_start_s, tb.kv_wire_start_s))
    assert second - first == pytest.approx(wire_s if link_scope == "fabric" else 0.0)


def serve_two_turns(cfg, first_prompt, follow_up, max_tokens, forced=None):
    """Turn 1, then turn 2 = turn 1's prompt + its answer + `follow_up` (a chat's next turn), on one
    deployment; both results."""

    async def main():
        dep = build_deployment(cfg, Clock())
        for e in dep.engines:
            e.start()
        one = await dep.proxy.submit(ClientRequest("t1", 0.0, first_prompt, max_tokens, forced))
        prompt = first_prompt + one.output_token_ids + follow_up
        two = ClientRequest("t2", dep.clock.now(), prompt, max_tokens, forced)
        two = await dep.proxy.submit(two)
        await dep.drain()
        for e in dep.engines:
            e.assert_empty()
        return one, two

    return run_async(main())


def test_a_second_turn_pulls_only_what_decode_does_not_hold():
    cfg = make_config(PD, SKIP, kv_transfer={"link": "pcie4-x16"})
    rng = np.random.default_rng(0)
    first, follow_up = rng.integers(0, 8192, 4000).tolist(), rng.integers(0, 8192, 400).tolist()
    one, two = serve_two_turns(cfg, first, follow_up, 600, rng.integers(0, 8192, 600).tolist())
    df = results_frame([one, two], "pd", 0.0, 0)
    kv_per_block = 16 * MODELS["qwen2.5-7b"].kv_bytes_per_token
    assert df.loc[0, "decode_cached_tokens"] == 0 and df.loc[0, "kv_bytes"] == cdiv(4000, 16) * kv_per_block
    # decode computed turn 1's prompt (from its last token on) and answer: all but the answer's last token
    held = (4000 + 600 - 1) // 16 * 16
    num_prompt = 4000 + 600 + 400
    assert df.loc[1, "decode_cached_tokens"] == held
    assert df.loc[1, "kv_bytes"] == (cdiv(num_prompt, 16) - held // 16) * kv_per_block
    assert df.loc[1, "prefill_cached_tokens"] == 4000 // 16 * 16  # prefill's own cache: turn 1's prompt
    assert two.finished_reason == "length"


def test_pd_reusing_decodes_own_cache_gives_collocated_greedy_tokens():
    """Real compute: the KV decode kept from turn 1 plus the pulled suffix gives the same greedy tokens
    as one collocated engine computing turn 2 with its own cache."""
    real = {"runner": {"compute": "real", "device": "cpu"}, "workload": {"output_policy": "greedy"}}
    rng = np.random.default_rng(3)
    first, follow_up = rng.integers(0, 8192, 150).tolist(), rng.integers(0, 8192, 37).tolist()
    pd_one, pd_two = serve_two_turns(make_config(PD, real), first, follow_up, 20)
    co_one, co_two = serve_two_turns(make_config(COLLOCATED, real), first, follow_up, 20)
    assert pd_one.output_token_ids == co_one.output_token_ids
    assert pd_two.times.num_cached_tokens > 100  # decode reused turn 1's KV
    assert pd_two.output_token_ids == co_two.output_token_ids


def test_the_handoff_parts_add_up_to_ttft_minus_prefill():
    """Under load (a busy decode, transfers queued on one link), every part shows and they add up."""
    cfg = make_config(
        {"pools": {"mixed": {"replicas": 0}, "prefill": {"replicas": 2}, "decode": {"replicas": 1}}},
        SKIP,
        kv_transfer={"link": "pcie4-x16"},
        scheduler={"num_gpu_blocks_override": 200, "max_model_len": 2048},
        workload={"prompt_len": 600, "output_len": 120},
    )
    requests = make_requests(24, [300 + 13 * i for i in range(24)], 120, forced=True, gap_s=0.01)
    results, _ = serve_recording_frees(cfg, requests)
    df = results_frame(results, "pd", 0.0, 0)
    parts = df[[f"handoff_{p}_s" for p in HANDOFF_PARTS]]
    prefill_part = df["prefill_done_s"] - df["arrival_s"]
    assert np.allclose(parts.sum(axis=1), df["ttft_s"] - prefill_part, rtol=0, atol=1e-9)
    assert (parts >= -1e-12).all().all()
    for busy in ("admission_wait", "link_queue", "notice_wait"):  # load shows in each waiting part
        assert (df[f"handoff_{busy}_s"] > 1e-6).any(), busy
    summary = summarize(df, cfg.slos)
    assert summary["median_handoff_wire_ms"] > 0 and summary["p99_handoff_admission_wait_ms"] > 0


def test_a_push_waits_for_decode_blocks_and_never_finishes_before_them():
    """Decode-first push: a decode engine with no room for the second request reserves its blocks only
    when the first one ends; the push starts then (visibly waiting), never earlier, so no lag."""
    cfg = make_config(
        PD,
        SKIP,
        kv_transfer={"link": "pcie4-x16", "mode": "push"},
        scheduler={"num_gpu_blocks_override": 100, "max_model_len": 1536},
        workload={"prompt_len": 1000, "output_len": 200},
    )
    first, second = make_requests(2, 1000, 200, forced=True, gap_s=0.2)
    run = run_virtual(cfg, [first, second])
    a, b = run.results.iloc[0], run.results.iloc[1]
    assert a["kv_transfer_start_s"] == pytest.approx(a["prefill_done_s"])  # blocks were ready before
    assert b["kv_blocks_ready_s"] >= a["finished_s"] > b["prefill_done_s"]  # no room until a ended
    assert b["kv_transfer_start_s"] == pytest.approx(b["kv_blocks_ready_s"])
    assert b["handoff_admission_wait_s"] > 1.0
    assert run.summary["lag_fraction"] == 0


def test_layerwise_push_hides_only_prefill_compute_after_decode_blocks_exist():
    """Layer-wise exposure never exceeds the full transfer and never credits compute that ran before
    decode had blocks: the request decode had no room for hides nothing."""
    base = {
        "kv_transfer": {"link": "pcie4-x16", "mode": "push"},
        "scheduler": {"num_gpu_blocks_override": 100, "max_model_len": 1536},
    }
    small = {"workload": {"prompt_len": 1000, "output_len": 200}}
    reqs = make_requests(2, 1000, 200, forced=True, gap_s=0.2)
    push = run_virtual(make_config(PD, SKIP, base, small), reqs).results
    layer = run_virtual(make_config(PD, SKIP, base, small, kv_transfer={"layerwise": True}), reqs).results
    full = push["kv_transfer_done_s"] - push["kv_transfer_start_s"]
    exposed = layer["kv_transfer_done_s"] - layer["kv_transfer_start_s"]
    assert (exposed <= full + 1e-12).all()
    assert exposed.iloc[0] == pytest.approx(full.iloc[0] / 28)  # blocks ready all along: hidden but a layer
    assert exposed.iloc[1] == pytest.approx(full.iloc[1])  # blocks only after prefill ended: nothing hidden


def test_a_push_notice_that_overtakes_its_request_is_kept_until_the_request_arrives():
    """Across actors, prefill's kv_ready may reach decode before decode's own copy of the request
    (seen live: the run hung). Decode keeps the notice and pushes once the request has its blocks."""
    cfg = make_config(PD, SKIP, kv_transfer={"mode": "push"}, workload={"prompt_len": 300, "output_len": 4})

    async def main():
        dep = build_deployment(cfg, Clock())
        prefill, decode = (next(e for e in dep.engines if e.role == role) for role in ("prefill", "decode"))
        for e in dep.engines:
            e.start()
        prompt = list(range(300))
        to_prefill = EngineRequest("x", prompt, 1, 0.0, [7], KVTransferParams(do_remote_decode=True))
        final = [out async for out in prefill.generate(to_prefill)][-1]
        await decode.kv_ready("x", final.kv_transfer_params)  # before decode has heard of "x"
        push = KVTransferParams(
            do_remote_prefill=True, kv_push=True, remote_engine_id=prefill.engine_id, remote_request_id="x"
        )
        to_decode = EngineRequest("x", prompt, 4, 0.0, [7, 8, 9, 10], push)
        outs = [out async for out in decode.generate(to_decode)]
        await dep.drain()
        for e in dep.engines:
            e.assert_empty()
        return outs[-1]

    last = run_async(main())
    assert last.finished_reason == "length" and last.times.handoff.kv_bytes > 0
