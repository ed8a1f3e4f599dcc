"""Faults injected on purpose (`faults:`), in virtual time: each kind completes its replay, every request
ends with exactly one row, and the summary counts the faults, the recoveries and the failures."""

from __future__ import annotations

import pytest

from cluster.config_load import load_designs
from cluster.virtual import run_virtual

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
    assert sum(r["num_rejected"] for r in out.engine_reports.values()) == len(rejected)
    assert all(r["num_expired_handoffs"] == 0 for r in out.engine_reports.values())  # freed at once


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
