"""The KV handoff as NIXL does it (virtual time, compute skip): when prefill frees, what moves, and
where the time goes."""

import pytest

from actors.engine.clock import Clock
from cluster.virtual import build_deployment
from target.profiles import LINKS, MODELS
from tests.factories import PD, make_config, make_requests, run_async
from workloads.replay import replay

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
            e.start()
        results = await replay(dep.proxy.submit, requests, dep.clock)
        await dep.drain()
        for e in dep.engines:
            e.assert_empty()
        return results

    return run_async(main()), freed


def test_prefill_holds_its_kv_until_decode_noticed_the_transfer():
    cfg = make_config(PD, SKIP, kv_transfer={"link": "guide-testbox"})
    results, freed = serve_recording_frees(cfg, make_requests(3, 4096, 8, forced=True, gap_s=0.5))
    for r in results:
        t = r.times
        assert t.kv_transfer_done_s - t.kv_transfer_start_s > 0.5  # the testbox link: most of a second
        assert freed[r.request_id] >= t.kv_noticed_s >= t.kv_transfer_done_s


def test_two_decodes_pulling_from_one_prefill_queue_on_its_link():
    """Two prompts finish in one prefill step; two decode engines pull them at once over the prefill
    engine's link: the second transfer waits for the first one's bytes (fixed costs overlap)."""
    cfg = make_config(
        {"pools": {"mixed": {"replicas": 0}, "prefill": {"replicas": 1}, "decode": {"replicas": 2}}},
        SKIP,
        kv_transfer={"link": "pcie4-x16"},
    )
    (a, b), _ = serve_recording_frees(cfg, make_requests(2, 1008, 4, forced=True, gap_s=0.0))
    assert a.engine != b.engine and a.prefill_done_s == b.prefill_done_s
    ta, tb = a.times, b.times
    assert ta.kv_transfer_start_s == tb.kv_transfer_start_s
    wire_s = 1008 * MODELS["qwen2.5-7b"].kv_bytes_per_token / LINKS["pcie4-x16"].bytes_per_s
    first, second = sorted((ta.kv_transfer_done_s, tb.kv_transfer_done_s))
    assert second - first == pytest.approx(wire_s)
