"""The engine on a virtual-time loop: invariants, prefix cache, preemption, determinism, aborts."""

import asyncio

import pytest

from actors.engine.clock import Clock, DeadlockError, VirtualTimeLoop
from actors.engine.runner.tiny_model import ensure_model
from actors.engine.step_clock import StepClock
from cluster.config_load import load_designs
from cluster.virtual import build_deployment, run_virtual, serve
from dashboards import metrics as m
from dashboards.exposition import sum_series
from emulation.config import RunnerConfig
from messages import EngineRequest, KVTransferParams
from tests.factories import COLLOCATED, PD, make_config, make_requests, run_async, run_requests
from workloads.replay import workload_for

SKIP = {"runner": {"compute": "skip"}}
REAL_GREEDY = {"runner": {"compute": "real", "device": "cpu"}, "workload": {"output_policy": "greedy"}}


def test_forced_outputs_and_nothing_left_behind():
    cfg = make_config(COLLOCATED, SKIP, scheduler={"max_num_batched_tokens": 256})
    reqs = make_requests(12, [100 + 37 * i for i in range(12)], 20, gap_s=0.05, forced=True)
    results, dep = run_requests(cfg, reqs)  # serve() asserts every engine empty
    for r, q in zip(results, reqs, strict=True):
        assert r.finished_reason == "length"
        assert r.output_token_ids == q.forced_output_token_ids
        assert r.token_times_s == sorted(r.token_times_s)
    (engine,) = dep.engines
    assert engine.stats.max_num_scheduled_tokens <= 256
    assert engine.stats.num_scheduled_tokens == sum(len(q.prompt_token_ids) + 19 for q in reqs)


def test_repeated_prompt_hits_prefix_cache_and_is_faster():
    cfg = make_config(COLLOCATED, SKIP)
    (a, b) = make_requests(2, 1024, 4, gap_s=5.0, forced=True)
    b.prompt_token_ids = list(a.prompt_token_ids)
    results, dep = run_requests(cfg, [a, b])
    assert results[0].times.num_cached_tokens == 0
    assert results[1].times.num_cached_tokens == 1008  # 63 of 64 blocks: the last token is recomputed
    ttft = [r.token_times_s[0] - r.arrival_s for r in results]
    assert ttft[1] < ttft[0] / 2  # one memory-bound step instead of a compute-bound prefill
    assert dep.engines[0].scheduler.blocks.num_prefix_cache_hits == 1008


def test_preemption_under_kv_pressure_keeps_greedy_tokens_exact():
    reqs = make_requests(6, 60, 40, gap_s=0.0)
    roomy, _ = run_requests(make_config(COLLOCATED, REAL_GREEDY), reqs)
    tight_cfg = make_config(
        COLLOCATED,
        REAL_GREEDY,
        scheduler={"num_gpu_blocks_override": 16, "max_model_len": 256},
        workload={"prompt_len": 60, "output_len": 40},
    )
    tight, dep = run_requests(tight_cfg, reqs)
    assert dep.engines[0].scheduler.num_preemptions > 0
    assert sum(r.times.num_preemptions for r in tight) == dep.engines[0].scheduler.num_preemptions
    assert [r.output_token_ids for r in tight] == [r.output_token_ids for r in roomy]


def test_same_seed_same_run_different_seed_different_run():
    cfg = make_config(
        COLLOCATED, SKIP, workload={"num_requests": 20, "prompt_len": 500, "output_len": 30, "rate": 4.0}
    )
    a, b = run_virtual(cfg), run_virtual(cfg)
    assert a.results["token_times_s"].tolist() == b.results["token_times_s"].tolist()
    c = run_virtual(
        make_config(
            COLLOCATED,
            SKIP,
            workload={"num_requests": 20, "prompt_len": 500, "output_len": 30, "rate": 4.0},
            seed=1,
        )
    )
    assert a.results["arrival_s"].tolist() != c.results["arrival_s"].tolist()


def test_a_run_without_metrics_is_the_same_run():
    """Sweeps record no metrics (they keep only summaries and results): nothing else may change."""
    for design in (COLLOCATED, PD):
        cfg = make_config(design, SKIP, workload={"num_requests": 20, "prompt_len": 500, "output_len": 30})
        full, bare = run_virtual(cfg), run_virtual(cfg, metrics=False)
        assert bare.summary == full.summary
        assert bare.results.equals(full.results)
        assert bare.engine_reports == full.engine_reports
        assert "proxy" in full.metrics and not bare.metrics


def test_client_closing_the_stream_aborts_the_request():
    cfg = make_config(
        COLLOCATED, SKIP, runner={"compute": "skip", "macro_steps": False}
    )  # every token streamed

    async def main():
        dep = build_deployment(cfg, Clock())
        (engine,) = dep.engines
        engine.start()
        req = EngineRequest("x", list(range(300)), 50, forced_output_token_ids=list(range(50)))
        stream = engine.generate(req)
        first = await anext(stream)
        await stream.aclose()
        await asyncio.sleep(1.0)
        await engine.drain()
        engine.assert_empty()
        return first, engine.stats

    first, stats = run_async(main())
    assert first.new_token_ids and first.finished_reason is None
    # Finished on its own, it would have run 49 more decode steps within the second: aborted, it ran
    # none past the one under way when the stream closed.
    assert stats.num_scheduled_tokens <= 300 + 1 and stats.num_steps <= 2


def abort_mid_decode(macro_steps: bool) -> tuple[list[int], list[float], str | None]:
    """A request aborted 0.5 s (emulated) into its decode: its tokens, their stamps, how it ended."""
    cfg = make_config(COLLOCATED, runner={"compute": "skip", "macro_steps": macro_steps})

    async def main():
        dep = build_deployment(cfg, Clock())
        (engine,) = dep.engines
        engine.start()
        req = EngineRequest("x", list(range(300)), 50, forced_output_token_ids=list(range(50)))
        outs = []

        async def consume():
            async for out in engine.generate(req):
                outs.append(out)

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.5)
        engine.abort("x")
        await task
        await engine.drain()
        engine.assert_empty()
        return outs

    outs = run_async(main())
    tokens = [t for o in outs for t in o.new_token_ids]
    return tokens, [t for o in outs for t in o.token_times_s], outs[-1].finished_reason


def test_an_abort_mid_decode_ends_after_the_steps_begun():
    """The abort lands inside a decode-only stretch (one window with macro steps): the tokens of the
    steps begun by then are out, the rest never run, nothing is left, and both ways agree."""
    tokens, stamps, reason = abort_mid_decode(True)
    assert reason == "abort" and 0 < len(tokens) < 50 and tokens == list(range(len(tokens)))
    assert stamps[-2] < 0.5 < stamps[-1]  # the last: the step under way at the abort
    assert (tokens, stamps, reason) == abort_mid_decode(False)


def test_virtual_time_jumps_and_detects_deadlock():
    loop = VirtualTimeLoop()
    try:
        loop.run_until_complete(asyncio.sleep(3600))
        assert loop.time() == pytest.approx(3600)
        with pytest.raises(DeadlockError):
            loop.run_until_complete(asyncio.Event().wait())
    finally:
        loop.close()


def test_a_forced_answer_shorter_than_max_tokens_stops():
    cfg = make_config(COLLOCATED, SKIP)
    (q,) = make_requests(1, 100, 10, forced=True)
    q.forced_output_token_ids = q.forced_output_token_ids[:4]
    (r,), _ = run_requests(cfg, [q])
    assert r.finished_reason == "stop" and r.output_token_ids == q.forced_output_token_ids


def test_a_slow_consumer_gets_coalesced_outputs_and_the_final_one():
    cfg = make_config(COLLOCATED, SKIP)

    async def main():
        dep = build_deployment(cfg, Clock())
        (engine,) = dep.engines
        engine.start()
        outs = []
        async for out in engine.generate(
            EngineRequest("x", list(range(300)), 40, forced_output_token_ids=list(range(40)))
        ):
            outs.append(out)
            await asyncio.sleep(0.2)  # slower than the ~25 ms steps: tokens pile up, even the last ones
        await engine.drain()
        return outs

    outs = run_async(main())
    assert outs[-1].finished_reason == "length"
    assert [t for o in outs for t in o.new_token_ids] == list(range(40))
    assert len(outs) < 40


def test_a_crashing_engine_fails_every_request_instead_of_hanging():
    cfg = make_config(COLLOCATED, SKIP)
    reqs = make_requests(3, 200, 30, forced=True, gap_s=0.0)

    async def main():
        dep = build_deployment(cfg, Clock())
        (engine,) = dep.engines

        async def broken(batch):
            raise RuntimeError("runner fell over")

        engine.executor.execute = broken
        engine.start()
        results = await asyncio.gather(*(dep.proxy.submit(q) for q in reqs))
        with pytest.raises(RuntimeError, match="fell over"):
            await engine.drain()
        return results

    results = run_async(main())
    assert [r.finished_reason for r in results] == ["error"] * 3
    assert all("crashed" in r.error for r in results)


def test_requests_reaching_a_crashed_engine_fail_and_the_run_ends_with_its_error(monkeypatch):
    """Requests that arrive after an engine's step loop broke are refused with the cause (they used to
    wait forever: the run then ended in a deadlock instead of the engine's error)."""
    from actors.engine.runner.executor import Executor

    execute = Executor.execute

    async def breaks_on_r2(self, batch):
        if any(r.request_id == "r2" for r in batch.requests):
            raise TypeError("step bug")
        return await execute(self, batch)

    monkeypatch.setattr(Executor, "execute", breaks_on_r2)
    seen = []
    with pytest.raises(TypeError, match="step bug"):
        run_virtual(
            make_config(COLLOCATED, SKIP), make_requests(6, 200, 30, forced=True, gap_s=2.0), seen.append
        )
    assert [r.finished_reason for r in seen] == ["length"] * 2 + ["error"] * 4  # r2: in the broken step
    assert all("mixed-0 crashed: TypeError: step bug" in r.error for r in seen[2:])
    assert all(r.error.startswith("EngineDeadError") for r in seen[3:])  # refused: arrived after


async def _collect(engine, req):
    return [out async for out in engine.generate(req)][-1]


@pytest.mark.timeout(60)  # the bugs these guard against were an idle engine spinning forever
def test_requests_sent_ahead_out_of_arrival_order_are_served_in_arrival_order():
    cfg = make_config(COLLOCATED, SKIP)

    async def main():
        (engine,) = build_deployment(cfg, Clock()).engines
        engine.start()
        late = EngineRequest("late", list(range(64)), 2, arrival_time_s=1.0, forced_output_token_ids=[1, 2])
        early = EngineRequest(
            "early", list(range(64)), 2, arrival_time_s=0.999, forced_output_token_ids=[1, 2]
        )
        outs = await asyncio.gather(_collect(engine, late), _collect(engine, early))
        await engine.drain()
        engine.assert_empty()
        return outs

    late, early = run_async(main())
    assert early.times.first_scheduled_s == pytest.approx(0.999)
    assert late.times.first_scheduled_s >= 1.0


@pytest.mark.timeout(60)
def test_a_request_blocked_by_unpulled_kv_runs_when_the_hold_expires():
    cfg = make_config(
        {"pools": {"mixed": {"replicas": 0}, "prefill": {"replicas": 1}, "decode": {"replicas": 1}}},
        SKIP,
        scheduler={"num_gpu_blocks_override": 8, "max_model_len": 128},
        kv_transfer={"hold_timeout_s": 30.0},
        workload={"prompt_len": 100, "output_len": 1},
    )

    async def main():
        dep = build_deployment(cfg, Clock())
        prefill = next(e for e in dep.engines if e.role == "prefill")
        prefill.start()
        keep = KVTransferParams(do_remote_decode=True)
        held = EngineRequest(
            "held", list(range(100)), 1, kv_transfer_params=keep, forced_output_token_ids=[7]
        )
        first = await _collect(prefill, held)  # its 7 blocks stay held: no decode engine pulls them
        blocked = EngineRequest("blocked", list(range(1000, 1100)), 1, forced_output_token_ids=[7])
        second = await _collect(prefill, blocked)
        await prefill.free_kv("held")  # a decode engine's notice, after the hold expired (NIXL counts it)
        await prefill.drain()
        prefill.assert_empty()
        return first, second, prefill.stats.num_expired_handoffs, dep.expositions()[prefill.engine_id]

    first, second, expired, exposition = run_async(main())
    assert expired == 1
    assert second.times.first_scheduled_s == pytest.approx(first.times.finished_s + 30.0)
    assert sum_series([exposition], m.NIXL_KV_EXPIRED.exposed) == 1
    assert sum_series([exposition], m.NIXL_AFTER_EXPIRY.exposed) == 1


def test_a_request_longer_than_max_model_len_fails_visibly_and_the_rest_run():
    cfg = make_config(COLLOCATED, SKIP, scheduler={"max_model_len": 1000}, workload={"prompt_len": 100})
    reqs = make_requests(2, [990, 100], 20, forced=True)
    (too_long, fine), _ = run_requests(cfg, reqs)
    assert (
        too_long.finished_reason == "error"
        and "Prompt and max_tokens exceed max_model_len (1000)." in too_long.error
    )
    assert fine.finished_reason == "length"


def test_engines_check_token_ids_against_the_loaded_models_vocabulary():
    """runner.vocab_size sizes the tiny model it builds; a model from runner.model_path has its own."""
    path = ensure_model(RunnerConfig())  # the project's tiny model: 8,192 tokens
    cfg = make_config(COLLOCATED, runner={"compute": "real", "model_path": str(path), "vocab_size": 100_000})

    async def main():
        (engine,) = build_deployment(cfg, Clock()).engines
        with pytest.raises(ValueError, match=r"in \[0, 8192\)"):
            await anext(engine.generate(EngineRequest("x", [9000], 1)))

    run_async(main())


@pytest.mark.timeout(30)  # spinning, virtual time stands still: only a wall-clock limit ends it
def test_a_virtual_loop_reused_at_a_late_time_does_not_spin() -> None:
    """asyncio runs a timer up to its clock's resolution early; an idle engine must count an event
    that close as due, or, on a virtual loop far from time 0, it wakes forever without time moving."""
    (cfg,) = load_designs("guide-l40s", ["collocated"], ["runner.compute=skip", "workload.num_requests=6"])
    requests = workload_for(cfg)
    loop = VirtualTimeLoop()
    try:
        loop.run_until_complete(serve(cfg, requests))  # leaves the loop at a late time
        results, _ = loop.run_until_complete(serve(cfg, requests))
    finally:
        loop.close()
    assert [r.finished_reason for r in results] == ["length"] * 6


def test_virtual_timers_due_together_run_in_the_order_set():
    """asyncio's timer heap breaks ties by heap position; the virtual loop runs them in the order they
    were set, whatever else is in the heap (else a run with fewer timers elsewhere, as with decode
    windows, would order a trace's whole-second arrivals differently)."""
    order = []

    async def main():
        loop = asyncio.get_running_loop()
        for i in range(40):  # other timers in the heap, set in between
            loop.call_later(1.0 + (i % 7) * 0.1, lambda: None)
            loop.call_later(2.0, order.append, i)
        await asyncio.sleep(3.0)

    run_async(main())
    assert order == list(range(40))


def test_a_sleep_nothing_could_interleave_with_moves_time_at_once_and_changes_nothing(monkeypatch):
    """`Clock.sleep_until` on a virtual loop moves time on without a timer when nothing could run
    first (no callback ready, no timer due by then): the same events at the same times, bit for bit,
    as sleeping through the loop."""

    async def main(log):
        clock = Clock()
        loop = asyncio.get_running_loop()

        async def stepper(name, step_s, n):
            t = 0.0
            for _ in range(n):
                t += step_s
                await clock.sleep_until(t)
                log.append((name, clock.now()))

        for i in range(5):  # timers in between, and one due with a step's end
            loop.call_later(0.7 * i + 0.05, lambda i=i: log.append(("timer", i, clock.now())))
        loop.call_later(0.3, lambda: log.append(("tie", clock.now())))
        await asyncio.gather(stepper("a", 0.1, 40), stepper("b", 0.37, 9))

    skipping, sleeping = [], []
    run_async(main(skipping))
    with monkeypatch.context() as m:
        m.setattr(VirtualTimeLoop, "skip", lambda self, delay: False)
        run_async(main(sleeping))
    assert skipping == sleeping
    assert len(skipping) == 40 + 9 + 5 + 1


def test_a_run_moves_time_without_timers_where_it_can():
    """In the guide's P/D design some sleeps skip the loop's timers (the saving is a benchmark's
    figure; this checks that a real run takes the path the equality test above covers)."""
    calls = {"skipped": 0, "slept": 0}
    skip = VirtualTimeLoop.skip

    def counting(self, delay):
        moved = skip(self, delay)
        calls["skipped" if moved else "slept"] += 1
        return moved

    (cfg,) = load_designs("guide-l40s", ["pd-fast"], ["runner.compute=skip", "workload.num_requests=20"])
    with pytest.MonkeyPatch.context() as m:
        m.setattr(VirtualTimeLoop, "skip", counting)
        run_virtual(cfg, metrics=False)
    assert calls["skipped"] > 0 and calls["slept"] > 0


def test_a_change_from_outside_settles_the_nap_before_it_changes_anything():
    """A window's nap ends at the first wake, whose `settle` runs before the waker goes on (so what it
    changes, and whoever reads the state next, meets the steps begun by then); a nap left alone runs
    to its end without settling."""

    async def main():
        clock = Clock()
        step_clock = StepClock(clock)
        settled: list[float] = []
        changed: list[list[float]] = []

        async def outside() -> None:
            await clock.sleep_until(3.0)
            step_clock.wake()
            changed.append(list(settled))  # what the change meets

        task = asyncio.ensure_future(outside())
        came = await step_clock.nap(10.0, lambda: settled.append(clock.now()))
        await task
        assert (came, settled, changed) == (False, [3.0], [[3.0]])
        step_clock.wake()  # no nap under way: nothing to settle
        assert await step_clock.nap(12.0, lambda: settled.append(-1.0)) is True
        assert settled == [3.0] and clock.now() == 12.0

    loop = VirtualTimeLoop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
