"""Faults injected on purpose (`faults:`), in virtual time: each kind completes its replay, every request
ends with exactly one row, and the summary counts the faults, the recoveries and the failures."""

from __future__ import annotations

import pytest

from cluster.config_load import load_designs
from cluster.virtual import run_virtual
from dashboards import metrics as m
from dashboards.exposition import sum_series

NUM_REQUESTS = 40
P2D2 = [
    "runner.compute=skip",
    f"workload.num_requests={NUM_REQUESTS}",
    "workload.rate=2",
    "pools.prefill.replicas=2",
    "pools.decode.replicas=2",
]
KINDS = {  # kind: (overrides, what the summary must show)
    "kv-rate-fail": (["faults.kv_transfer_failure_rate=0.2"], {"num_injected_load_failures": ">0"}),
    "kv-nth-recompute": (
        ["faults.kv_transfer_failures=[2,4,6]", "kv_transfer.load_failure_policy=recompute"],
        {"num_injected_load_failures": 6, "num_recomputed_loads": 6, "failed": 0},
    ),
    "prefill-killed": (
        ["faults.engine_kills=[{engine: prefill-0, at_s: 6}]", "kv_transfer.load_failure_policy=recompute"],
        {"num_engines_lost": 1, "num_prefill_retries": ">0", "failed": 0},
    ),
    "prefill-hung": (
        # (at half the others' rate: one prefill engine then carries the load and the retries)
        [
            "faults.engine_hangs=[{engine: prefill-0, at_s: 12}]",
            "router.prefill_timeout_s=4",
            "workload.rate=1",
        ],
        {"num_engines_hung": 1, "num_prefill_timeouts": ">0", "failed": 0},
    ),
    "proxy-killed": (["faults.proxy_kills=[6]"], {"num_proxy_restarts": 1, "failed": ">0"}),
    "decode-killed": (
        ["faults.engine_kills=[{engine: decode-1, at_s: 6}]"],
        {"num_engines_lost": 1, "failed": ">0"},
    ),
}


def run(kind: str, *extra: str):
    sets, _ = KINDS[kind]
    (cfg,) = load_designs("guide-l40s", ["pd-fast"], [*P2D2, *sets, *extra])
    return run_virtual(cfg)  # engines are checked empty at the end: no request or block left


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_fault_kind_completes_and_every_request_is_accounted_for(kind):
    out = run(kind)
    df, s = out.results, out.summary
    assert len(df) == NUM_REQUESTS and df["request_id"].is_unique  # one final row each
    assert s["completed"] + s["failed"] == NUM_REQUESTS  # (nothing is rejected: no admission limit)
    assert s["failed"] == (~df["ok"]).sum() and df.loc[~df["ok"], "error"].notna().all()
    for key, want in KINDS[kind][1].items():
        assert s[key] > 0 if want == ">0" else s[key] == want, (key, s[key])


def test_a_killed_prefill_engine_is_never_routed_to_again_and_its_requests_went_elsewhere():
    df = run("prefill-killed").results
    killed_at = 6.0
    assert (df.loc[df["arrival_s"] > killed_at + 1, "prefill_engine"] == "prefill-1").all()
    retried = df[df["num_prefill_retries"] > 0]
    assert (retried["prefill_engine"] == "prefill-1").all() and retried["ok"].all()


def test_the_proxys_health_checks_take_a_dead_engine_out_of_routing_before_a_request_finds_it():
    """router.health_check_interval_s: prefill-0 killed at 6 s leaves routing by the check after it,
    so no request sent later is sent there and retried; without checks, the router learns of it
    only from requests that fail there (round robin keeps sending every other one until one does)."""

    def sent_late(interval):
        df = run("prefill-killed", f"router.health_check_interval_s={interval}").results
        return df[df["arrival_s"] > 7.0]

    checked, unchecked = sent_late(1), sent_late("null")
    assert len(checked) > 10 and (checked["num_prefill_retries"] == 0).all()
    assert (checked["prefill_engine"] == "prefill-1").all()
    assert (unchecked["num_prefill_retries"] > 0).any()


def test_requests_on_a_hung_prefill_engine_time_out_there_and_are_served_by_another():
    """faults.engine_hangs: prefill-0 stops answering at 12 s without an error; the proxy gives up on
    each request there after router.prefill_timeout_s, aborts it (the hung engine ends empty) and
    retries it on prefill-1; the first timeout takes prefill-0 out of routing (it never answers again)."""
    df = run("prefill-hung").results
    timed_out = df[df["num_prefill_timeouts"] > 0]
    assert len(timed_out) > 0 and timed_out["ok"].all()
    assert (timed_out["prefill_engine"] == "prefill-1").all()
    assert (timed_out["ttft_s"] >= 4.0).all() and (
        df.loc[df["num_prefill_timeouts"] == 0, "ttft_s"] < 4
    ).all()
    first_given_up = (timed_out["arrival_s"] + 4.0).min()
    later = df[df["arrival_s"] > first_given_up]
    assert len(later) > 0 and (later["prefill_engine"] == "prefill-1").all()


def test_an_overloaded_pool_keeps_its_last_engine_in_routing_when_its_prefills_time_out():
    """One prefill engine, overloaded past router.prefill_timeout_s: the requests that waited too long
    fail with the timeout, but the engine is never taken out (it is slow, not gone): later requests
    still reach it and some complete."""
    (cfg,) = load_designs(
        "guide-l40s",
        ["pd-fast"],
        ["runner.compute=skip", "workload.num_requests=40", "workload.rate=4", "router.prefill_timeout_s=3"],
    )
    out = run_virtual(cfg)
    df = out.results
    failed = df[~df["ok"]]
    assert len(failed) > 0 and failed["error"].str.contains("no answer within router.prefill_timeout_s").all()
    first_timeout_s = failed["arrival_s"].min() + 3
    assert df.loc[df["arrival_s"] > first_timeout_s, "ok"].any()
    assert (df["num_prefill_retries"] == 0).all()  # (a retry would queue behind the same backlog)
    assert out.summary["num_prefill_timeouts"] == len(failed)


def test_a_killed_proxy_fails_exactly_the_requests_in_flight_through_it_and_serves_the_rest():
    """faults.proxy_kills: at 6 s every request the proxy is serving fails with the reason (the engines
    abort them: they end empty); it restarts at once and every later request is served."""
    df = run("proxy-killed").results
    failed = df[~df["ok"]]
    assert len(failed) > 0 and failed["error"].str.contains("proxy killed at 6 s").all()
    assert (failed["arrival_s"] <= 6.0).all() and (df.loc[df["arrival_s"] > 6.0, "ok"]).all()
    done_before = df["ok"] & (df["arrival_s"] + df["e2el_s"] <= 6.0)
    assert (df["ok"] == done_before | (df["arrival_s"] > 6.0)).all()  # the rest were in flight


def test_injected_failures_are_the_same_for_a_seed_and_differ_across_seeds():
    failed = [
        set(run("kv-rate-fail", f"seed={seed}").results.query("not ok")["request_id"]) for seed in (0, 0, 1)
    ]
    assert failed[0] == failed[1] and failed[0] != failed[2]


def test_without_retries_a_request_on_a_dying_prefill_engine_fails_with_the_reason():
    out = run("prefill-killed", "router.max_prefill_retries=0", "kv_transfer.load_failure_policy=fail")
    failed = out.results.query("not ok")
    assert len(failed) > 0 and failed["error"].str.contains("engine prefill-0 killed").all()
    assert out.summary["num_prefill_retries"] == 0


def test_past_the_admission_limit_requests_are_rejected_at_once_and_counted():
    """scheduler.max_waiting under a burst: the rest are refused at arrival (nothing computed, no KV
    held for them), and completed + failed + rejected is every request sent."""
    (cfg,) = load_designs(
        "guide-l40s",
        ["pd-fast"],
        [*P2D2, "workload.rate=50", "scheduler.max_waiting=2", "faults.kv_transfer_failures=[3]"],
    )
    out = run_virtual(cfg)
    df, s = out.results, out.summary
    rejected = df[df["finished_reason"] == "rejected"]
    assert s["rejected"] == len(rejected) > 0 and s["failed"] == s["num_injected_load_failures"] > 0
    assert s["completed"] + s["failed"] + s["rejected"] == NUM_REQUESTS == len(df)
    assert (rejected["num_output_tokens"] == 0).all() and rejected["error"].str.contains("max_waiting").all()
    assert (rejected["rejected_by"] == "max_waiting").all()
    assert sum(r.counters.num_rejected for r in out.engine_reports.values()) == len(rejected)
    assert all(r.counters.num_expired_handoffs == 0 for r in out.engine_reports.values())  # freed at once
    expos = list(out.metrics.values())  # vLLM's admission counter, the testbed's limit as its reason
    assert sum_series(expos, m.ADMISSION_REJECTIONS.exposed, reason="max_waiting") == len(rejected)
    assert sum_series(expos, m.ADMISSION_REJECTIONS.exposed) == len(rejected)
    assert sum_series(expos, m.NIXL_AFTER_EXPIRY.exposed) == 0  # every notice found its KV held


def test_past_vllms_queue_limits_requests_are_rejected_at_once_and_counted_under_vllms_reasons():
    """scheduler.max_num_queued_reqs under the same burst, P/D: prefill and decode engines each refuse
    past the limit (a decode refusal frees the prefill KV held for it), every refusal counted in
    `vllm:admission_rejections` under vLLM's reason and named in its row."""
    (cfg,) = load_designs(
        "guide-l40s", ["pd-fast"], [*P2D2, "workload.rate=50", "scheduler.max_num_queued_reqs=2"]
    )
    out = run_virtual(cfg)
    df, s = out.results, out.summary
    rejected = df[df["finished_reason"] == "rejected"]
    assert s["rejected"] == len(rejected) > 0 and s["completed"] + s["rejected"] == NUM_REQUESTS
    assert (rejected["rejected_by"] == "max_num_queued_reqs").all()
    assert df.loc[df["ok"], "rejected_by"].isna().all()
    at_decode = rejected["prefill_done_s"].notna()  # prefill computed it, decode refused it
    assert 0 < at_decode.sum() < len(rejected)
    assert set(rejected.loc[at_decode, "engine"]) <= {"decode-0", "decode-1"}
    assert all(r.counters.num_expired_handoffs == 0 for r in out.engine_reports.values())  # freed at once
    expos = list(out.metrics.values())
    assert sum_series(expos, m.ADMISSION_REJECTIONS.exposed, reason="max_num_queued_reqs") == len(rejected)
    assert sum_series(expos, m.ADMISSION_REJECTIONS.exposed) == len(rejected)


@pytest.mark.parametrize("design", ["collocated", "pd-fast"])
def test_past_the_queue_time_budget_waiting_requests_are_rejected_and_none_started_late(design):
    """scheduler.max_queue_time_s under overload: a request still waiting for its first step when its
    budget runs out is refused then (a decode request's prefill KV freed); none that ran waited longer."""
    (cfg,) = load_designs(
        "guide-l40s",
        [design],
        [
            "runner.compute=skip",
            "workload.num_requests=60",
            "workload.rate=8",
            "scheduler.max_queue_time_s=2",
        ],
    )
    out = run_virtual(cfg)  # engines are checked empty: nothing left queued or held
    df, s = out.results, out.summary
    rejected = df[df["finished_reason"] == "rejected"]
    assert s["rejected"] == len(rejected) > 0 and s["completed"] + s["rejected"] == 60
    assert (
        rejected["error"].str.contains("max_queue_time_s").all()
        and (rejected["num_output_tokens"] == 0).all()
    )
    assert (rejected["rejected_by"] == "max_queue_time_s").all()
    waited = rejected["finished_s"] - rejected["queued_s"]
    assert ((waited >= 2.0) & (waited < 2.5)).all()  # refused at the first step boundary past it
    ran = df[df["ok"]]
    assert ((ran["first_scheduled_s"] - ran["queued_s"]) <= 2.0).all()
    assert sum(r.counters.num_rejected for r in out.engine_reports.values()) == len(rejected)
    assert all(r.counters.num_expired_handoffs == 0 for r in out.engine_reports.values())


def test_a_slowed_link_slows_only_the_transfers_starting_in_its_windows():
    """A flapping link (two windows at a tenth of the bandwidth): transfers that start inside take 10x
    the wire time, the others the link's own; the run completes."""
    windows = (
        "[{start_s: 4, end_s: 8, bandwidth_factor: 0.1}, {start_s: 12, end_s: 14, bandwidth_factor: 0.1}]"
    )
    plain = run("kv-rate-fail", "faults.kv_transfer_failure_rate=0").results
    slowed = run(
        "kv-rate-fail", "faults.kv_transfer_failure_rate=0", f"faults.link_slowdowns={windows}"
    ).results
    start = slowed["kv_transfer_start_s"]
    inside = ((start >= 4) & (start < 8)) | ((start >= 12) & (start < 14))
    assert inside.sum() >= 5 and (~inside).sum() >= 5 and slowed["ok"].all()
    bytes_per_s = slowed["kv_bytes"] / slowed["kv_wire_s"]
    plain_rate = float((plain["kv_bytes"] / plain["kv_wire_s"]).iloc[0])
    assert bytes_per_s[inside].to_numpy() == pytest.approx(plain_rate / 10)
    assert bytes_per_s[~inside].to_numpy() == pytest.approx(plain_rate)
