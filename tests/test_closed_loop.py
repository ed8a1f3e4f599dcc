"""Closed-loop load (`workload.max_concurrency`, as `vllm bench serve --max-concurrency`), a warm-up left
out of the figures (`workload.num_warmup_requests`), lengths drawn around their nominal values
(`workload.random_range_ratio`, vLLM's `--random-range-ratio`) and the summary's bench-serve figures."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time

import numpy as np
import pandas as pd
import pytest

from actors.engine.clock import Clock
from cluster.cli import main
from cluster.config_load import ConfigError, load_designs
from cluster.virtual import run_virtual
from emulation.config import WorkloadConfig
from messages import ClientRequest, RequestResult
from tests.factories import COLLOCATED, PD, TRACES, make_config, make_requests, run_async
from workloads.closed_loop import ClosedLoop
from workloads.results import results_frame
from workloads.summary import summarize
from workloads.synthetic import length_bounds, output_len_bounds, prompt_len_bounds, synthetic_requests

SKIP = {"runner": {"compute": "skip"}}
SMALL = {"prompt_len": 512, "output_len": 32}


def closed_loop_run(*layers, **workload):
    """A virtual run, compute skip, of a small synthetic workload (`workload`'s fields over SMALL)."""
    cfg = make_config(*layers, SKIP, workload={**SMALL, **workload})
    return run_virtual(cfg, metrics=False)


def max_in_flight(sent_s, finished_s) -> int:
    """The most requests in flight at once, a request in flight from its send to its finish (a finish
    at the instant of a send frees its slot first)."""
    events = sorted([(t, 1) for t in sent_s] + [(t, -1) for t in finished_s])
    in_flight = most = 0
    for _, step in events:
        in_flight += step
        most = max(most, in_flight)
    return most


def finished_s(df: pd.DataFrame) -> pd.Series:
    return df["token_times_s"].map(lambda t: t[-1])


@pytest.mark.parametrize("layout", [COLLOCATED, PD], ids=["collocated", "pd"])
def test_never_more_than_max_concurrency_requests_in_flight(layout):
    out = closed_loop_run(layout, max_concurrency=16, num_requests=120)
    df = out.results
    assert len(df) == 120 and df["ok"].all() and out.summary["completed"] == 120
    assert max_in_flight(df["arrival_s"], finished_s(df)) == 16  # kept full, never over
    # The first 16 go at once; every later one the moment an earlier one finished, in request order.
    assert (df["arrival_s"][:16] == 0).all() and (df["arrival_s"][16:] > 0).all()
    assert df["arrival_s"].is_monotonic_increasing
    assert set(df["arrival_s"][16:]) <= set(finished_s(df))
    assert out.summary["max_concurrency"] == 16


def test_open_loop_is_unchanged_by_default():
    """Without max_concurrency: Poisson arrivals at `rate`, as before; no closed-loop keys."""
    out = closed_loop_run(COLLOCATED, num_requests=20, rate=2.0)
    cfg = make_config(workload={**SMALL, "num_requests": 20, "rate": 2.0})
    requests = synthetic_requests(cfg.workload, cfg.runner.vocab_size, cfg.seed)
    assert out.results["arrival_s"].tolist() == [r.arrival_s for r in requests]
    assert "max_concurrency" not in out.summary and "num_warmup_requests" not in out.summary


def test_ttft_runs_from_the_send_and_counts_the_wait_in_the_scheduler():
    """16 in flight, 4 seats (max_num_seqs): most requests wait in the engine's queue, and their TTFT,
    from the moment the client sent them, counts that wait."""
    cfg = make_config(
        COLLOCATED,
        SKIP,
        scheduler={"max_num_seqs": 4},
        workload={**SMALL, "max_concurrency": 16, "num_requests": 64},
    )
    df = run_virtual(cfg, metrics=False).results
    assert df["ok"].all()
    # The engine saw each request from its send (after rendering), never earlier.
    np.testing.assert_allclose(df["queued_s"], df["arrival_s"] + df["render_s"], atol=1e-9)
    waited_s = df["first_scheduled_s"] - df["queued_s"]
    assert (waited_s > 0.05).sum() >= 12  # of the first 16 sent at once, 4 seats at a time
    np.testing.assert_allclose(df["ttft_s"], df["token_times_s"].map(lambda t: t[0]) - df["arrival_s"])
    assert (df["ttft_s"] >= df["render_s"] + waited_s - 1e-9).all()
    ample = make_config(COLLOCATED, SKIP, workload={**SMALL, "max_concurrency": 16, "num_requests": 64})
    assert df["ttft_s"].median() > run_virtual(ample, metrics=False).results["ttft_s"].median()


def test_a_slot_frees_when_its_request_fails_and_the_next_goes_at_once():
    """The driver alone (`ClosedLoop`), on a virtual clock: requests that fail (no token) free their
    slot as those that finish do; never more than N in flight."""
    sent: list[tuple[str, float]] = []
    done: dict[str, float] = {}

    async def scenario():
        clock = Clock(1.0)

        async def submit(creq: ClientRequest) -> RequestResult:
            sent.append((creq.request_id, creq.arrival_s))
            result = RequestResult.for_request(creq)
            i = int(creq.request_id[1:])
            await clock.sleep_until(creq.arrival_s + 0.1 * (1 + i % 3))
            done[creq.request_id] = clock.now()
            if i % 4 == 3:
                result.fail("refused")
            else:
                result.finished_reason = "length"
                result.token_times_s = [clock.now()]
            return result

        requests = make_requests(20, 8, 1)
        return await ClosedLoop(submit, clock, 3).run(requests), clock.now()

    results, end_s = run_async(scenario())
    assert [r.request_id for r in results] == [f"r{i}" for i in range(20)]
    assert [rid for rid, _ in sent] == [f"r{i}" for i in range(20)]  # in order
    assert sum(r.finished_reason == "error" for r in results) == 5
    done_s = [done[r.request_id] for r in results]
    assert max_in_flight([r.arrival_s for r in results], done_s) == 3
    assert {r.arrival_s for r in results[3:]} <= set(done_s)  # each sent when one was done
    assert end_s == pytest.approx(max(done_s))


def test_on_a_live_clock_slots_free_when_results_arrive():
    """The same driver on a live (monotonic) clock, as live mode and `replay --target` run it: each
    request's arrival time is when it left, and never more than N are out."""
    out_now: list[int] = []
    in_flight = 0

    async def scenario():
        nonlocal in_flight
        clock = Clock(1.0, epoch_s=time.monotonic())

        async def submit(creq: ClientRequest) -> RequestResult:
            nonlocal in_flight
            assert creq.arrival_s == pytest.approx(clock.now(), abs=0.005)
            in_flight += 1
            out_now.append(in_flight)
            await asyncio.sleep(0.01 * (1 + int(creq.request_id[1:]) % 2))
            in_flight -= 1
            result = RequestResult.for_request(creq)
            result.finished_reason = "length"
            result.token_times_s = [clock.now()]
            return result

        return await ClosedLoop(submit, clock, 4).run(make_requests(24, 8, 1))

    results = asyncio.run(scenario())
    assert len(results) == 24 and max(out_now) == 4
    first = [r.arrival_s for r in results[:4]]  # at once, at the start
    assert max(first) - min(first) < 0.005 and max(first) < results[4].arrival_s


def test_warmup_requests_are_in_the_results_but_not_in_the_figures():
    cfg = make_config(COLLOCATED, SKIP, workload={**SMALL, "max_concurrency": 8, "num_requests": 40})
    out = run_virtual(
        dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, num_warmup_requests=10))
    )
    df, summary = out.results, out.summary
    assert df["warmup"].dtype == bool
    assert df.loc[df["warmup"], "request_id"].tolist() == [f"req-{i:05d}" for i in range(10)]  # first sent
    assert len(df) == 40 and df["ok"].all()  # every request kept
    assert summary["completed"] == 30 and summary["num_warmup_requests"] == 10
    measured = df[~df["warmup"]]
    assert summary["mean_ttft_ms"] == pytest.approx(measured["ttft_s"].mean() * 1000)
    assert summary["duration_s"] == pytest.approx(finished_s(measured).max() - measured["arrival_s"].min())
    # Left out in one place (`summarize`): its figures are those of the table without the warm-up.
    alone = summarize(measured.drop(columns="warmup"), cfg.slos, summary["num_gpus"])
    assert json.dumps(alone, sort_keys=True) == json.dumps({k: summary[k] for k in alone}, sort_keys=True)
    # The warm-up changes nothing that is sent: the same requests at the same times, all counted.
    everything = run_virtual(cfg, metrics=False)
    pd.testing.assert_series_equal(everything.results["ttft_s"], df["ttft_s"])
    assert everything.summary["completed"] == 40 and not everything.results["warmup"].any()


def test_open_loop_warmup_is_the_first_arrivals():
    out = closed_loop_run(COLLOCATED, num_requests=12, rate=4.0, num_warmup_requests=3)
    df = out.results
    assert df["warmup"].tolist() == [True] * 3 + [False] * 9 and out.summary["completed"] == 9


def test_warmup_marks_the_first_sent_whatever_the_results_order():
    ids = ["b", "a", "c", "d"]
    times = [0.5, 0.0, 0.5, 0.2]
    results = [RequestResult(i, t, 4, 2) for i, t in zip(ids, times, strict=True)]
    df = results_frame(results, "x", 1.0, 0, num_warmup_requests=3)
    assert df.set_index("request_id")["warmup"].to_dict() == {"a": True, "d": True, "b": True, "c": False}


def test_the_same_seed_draws_the_same_lengths_and_times():
    def run(seed):
        cfg = make_config(
            PD,
            SKIP,
            seed=seed,
            workload={**SMALL, "max_concurrency": 6, "num_requests": 30, "random_range_ratio": 0.5},
        )
        return run_virtual(cfg, metrics=False).results

    a, b, c = run(3), run(3), run(4)
    for col in ("arrival_s", "num_prompt_tokens", "max_tokens", "token_times_s", "output_token_ids"):
        assert a[col].tolist() == b[col].tolist(), col
    assert a["num_prompt_tokens"].tolist() != c["num_prompt_tokens"].tolist()
    assert a["num_output_tokens"].tolist() == a["max_tokens"].tolist()  # EOS ignored: every drawn length


def test_range_ratio_lengths_lie_in_vllms_bounds_and_vary():
    w = WorkloadConfig(num_requests=600, prompt_len=400, output_len=40, random_range_ratio=0.25)
    requests = synthetic_requests(w, 8192, seed=7)
    prompts = np.array([len(r.prompt_token_ids) for r in requests])
    outputs = np.array([r.max_tokens for r in requests])
    assert prompt_len_bounds(w) == (300, 500) and output_len_bounds(w) == (30, 50)
    assert prompts.min() >= 300 and prompts.max() <= 500 and outputs.min() >= 30 and outputs.max() <= 50
    assert len(set(prompts)) > 100 and len(set(outputs)) > 15  # uniform over the range: they vary
    assert abs(prompts.mean() - 400) < 10 and abs(outputs.mean() - 40) < 1.5
    assert all(len(r.forced_output_token_ids or []) == r.max_tokens for r in requests)
    # The same gaps as fixed lengths: the ratio changes lengths, not arrival times.
    fixed = synthetic_requests(WorkloadConfig(num_requests=600, prompt_len=400, output_len=40), 8192, seed=7)
    assert [r.arrival_s for r in requests] == [r.arrival_s for r in fixed]


def test_length_bounds_round_as_vllm_does():
    """floor(L(1-R)), ceil(L(1+R)), in floats as vLLM computes them; outputs at least 1."""
    assert length_bounds(100, 0.1) == (90, 111)  # 100 x 1.1 = 110.00000000000001
    assert length_bounds(1024, 0.0) == (1024, 1024)
    assert length_bounds(922, 1 / 9) == (819, 1025)  # InferenceX's 0.8 to 1.0 of 1,024, about
    assert output_len_bounds(WorkloadConfig(output_len=1, random_range_ratio=0.5)) == (1, 2)


def test_a_ratio_of_0_draws_exactly_what_fixed_lengths_drew():
    """Runs without the ratio keep their random numbers: the same stream, nothing drawn in between."""
    w = WorkloadConfig(num_requests=5, prompt_len=64, output_len=8, rate=2.0)
    rng = np.random.default_rng(11)
    gaps = rng.standard_exponential(5) / 2.0
    prompts = rng.integers(0, 8192, size=(5, 64))
    answers = rng.integers(0, 8192, size=(5, 8))
    requests = synthetic_requests(w, 8192, seed=11)
    assert [r.arrival_s for r in requests] == pytest.approx(np.cumsum([0.0, *gaps[1:]]).tolist())
    assert [list(r.prompt_token_ids) for r in requests] == prompts.tolist()
    assert [r.forced_output_token_ids for r in requests] == answers.tolist()


def test_output_throughput_per_gpu_counts_every_pool_gpu():
    cfg = make_config(
        SKIP,
        pools={"mixed": {"replicas": 0}, "prefill": {"replicas": 2, "tp": 2}, "decode": {"replicas": 1}},
        workload={**SMALL, "max_concurrency": 4, "num_requests": 12},
    )
    out = run_virtual(cfg, metrics=False)
    s = out.summary
    assert cfg.pools.num_gpus == 5 and s["num_gpus"] == 5
    assert s["output_throughput_per_gpu"] == pytest.approx(s["output_throughput"] / 5)
    for key in ("mean", "median", "p99"):
        assert s[f"{key}_ttft_ms"] > 0 and s[f"{key}_tpot_ms"] > 0
    (epd,) = load_designs("epd-a100", ["e-p-d"])
    assert epd.pools.num_gpus == 4  # the encoder's GPU among them


def test_a_closed_loop_run_writes_the_warmup_column_and_the_bench_figures(tmp_path, capsys):
    argv = [
        "run",
        "--preset",
        "guide-l40s",
        "--design",
        "pd-fast",
        "--compute",
        "skip",
        "--num-requests",
        "12",
    ]
    for s in ("workload.max_concurrency=4", "workload.num_warmup_requests=2", "workload.prompt_len=1024",
              "workload.output_len=32", "workload.random_range_ratio=0.5"):  # fmt: skip
        argv += ["--set", s]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    df = pd.read_parquet(tmp_path / "results.parquet")
    assert df["warmup"].dtype == bool and df["warmup"].sum() == 2 and len(df) == 12
    assert df["num_prompt_tokens"].between(512, 1536).all() and df["num_prompt_tokens"].nunique() > 1
    (record,) = json.loads((tmp_path / "summary.json").read_text())
    assert record["completed"] == 10 and record["max_concurrency"] == 4 and record["num_gpus"] == 2
    assert record["output_throughput_per_gpu"] == pytest.approx(record["output_throughput"] / 2)
    assert all(record[f"{q}_{m}_ms"] is not None for q in ("mean", "median", "p99") for m in ("ttft", "tpot"))
    assert (
        "12 requests 4 at once (closed loop), the first 2 a warm-up" in (tmp_path / "report.html").read_text()
    )


@pytest.mark.parametrize(
    ("sets", "needles"),
    [
        (["workload.max_concurrency=0"], ["workload.max_concurrency=0", "must be >= 1"]),
        (["workload.random_range_ratio=1.5"], ["workload.random_range_ratio=1.5", "in [0, 1)"]),
        (["workload.num_warmup_requests=-1"], ["workload.num_warmup_requests=-1", ">= 0"]),
        (["workload.num_warmup_requests=6"], ["workload.num_warmup_requests=6", "allowed: 0 to 5"]),
        (
            ["workload.prompt_len=1", "workload.random_range_ratio=0.5"],
            [
                "workload.random_range_ratio=0.5",
                "prompts of 0 tokens",
                "floor(prompt_len x (1 - ratio)) >= 1",
            ],
        ),
        (
            ["workload.random_range_ratio=0.5", "scheduler.max_model_len=12000"],
            ["workload.random_range_ratio=0.5", "12672 tokens", "scheduler.max_model_len=12000"],
        ),
        (
            ["workload.kind=multi_turn", "workload.max_concurrency=4"],
            ["workload.max_concurrency=4", "synthetic requests only", "replay.max_sessions"],
        ),
    ],
)
def test_bad_values_are_one_clear_line(sets, needles, capsys, tmp_path):
    argv = ["run", "--preset", "guide-l40s", "--compute", "skip", "--num-requests", "6"]
    for s in sets:
        argv += ["--set", s]
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


def test_a_trace_replay_refuses_max_concurrency_and_names_its_own_closed_loop(capsys, tmp_path):
    trace = TRACES / "mooncake_fast25" / "conversation_trace.window_0s_1200s.jsonl"
    argv = ["replay", "--trace", str(trace), "--compute", "skip", "--set", "workload.max_concurrency=8"]
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "workload.kind='trace'" in err and "replay.max_sessions" in err, err
    with pytest.raises(ConfigError, match="max_concurrency"):
        make_config(workload={"kind": "trace", "max_concurrency": 2}, replay={"trace": str(trace)})


def test_summary_of_a_table_without_a_warmup_column_is_unchanged():
    """A results table written before warm-ups existed (no `warmup` column) summarizes as before."""
    out = closed_loop_run(COLLOCATED, num_requests=10, rate=2.0)
    with_column = summarize(out.results, [])
    without = summarize(out.results.drop(columns="warmup"), [])
    assert json.dumps(with_column, sort_keys=True) == json.dumps(without, sort_keys=True)
    assert with_column["num_gpus"] is None and with_column["output_throughput_per_gpu"] is None
    assert math.isfinite(with_column["output_throughput"])


@pytest.mark.parametrize("command", [["sweep", "--rates", "1,4"], ["plan"]])
def test_a_sweep_or_plan_of_a_closed_loop_is_refused_in_one_line(command, capsys):
    """They vary the arrival rate, which a closed loop does not have: one line, no run."""

    assert main([*command, "--preset", "guide-l40s", "--set", "workload.max_concurrency=4"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: workload.max_concurrency=4: testbed ") and "a closed loop has none" in line
