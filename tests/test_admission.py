"""vLLM's queue limits (`scheduler.max_num_queued_reqs`, `max_num_queued_tokens`): the rule's arithmetic
at its boundaries, against vLLM 0.32's own `AsyncLLM.check_admission` and the error body its server makes
of the refusal (`vllm_peer_scripts/admission.py`); what an engine counts as in flight and in prefill,
in emulated time; the refusals' rows and `vllm:admission_rejections` reasons."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from actors.api.errors import RETRY_AFTER_S, rejection
from actors.engine.kv_cache.coordinator import KVCacheCoordinator
from actors.engine.request import Request, RequestStatus
from actors.engine.scheduling.admission import VLLM_QUEUE_LIMITS, Admission, vllm_queue_limit
from actors.engine.scheduling.scheduler import Scheduler
from dashboards import metrics as m
from dashboards.exposition import sum_series
from messages import ClientRequest, EngineRequest
from tests.factories import COLLOCATED, make_config, run_requests
from tests.vllm_peer import run_script

SKIP = {"runner": {"compute": "skip"}, "render": {"s_per_call": 0.0, "s_per_prompt_token": 0.0}}
"""Compute skip, and requests reach the engine when they arrive (rendering costs no time)."""
BOUNDARIES = [  # (max_num_queued_reqs, max_num_queued_tokens, in flight, tokens in prefill, n) -> limit
    ((4, None, 3, 0, 1), None),
    ((4, None, 4, 0, 1), "max_num_queued_reqs"),  # current + n > max
    ((4, None, 2, 0, 2), None),
    ((4, None, 3, 0, 2), "max_num_queued_reqs"),
    ((0, None, 0, 0, 1), "max_num_queued_reqs"),
    ((None, 100, 9, 99, 1), None),
    ((None, 100, 9, 100, 1), "max_num_queued_tokens"),  # current >= max, whatever the new prompt
    ((None, 0, 0, 0, 1), "max_num_queued_tokens"),
    ((1, 100, 1, 100, 1), "max_num_queued_reqs"),  # the requests' limit first
    ((2, 100, 1, 100, 1), "max_num_queued_tokens"),
    ((None, None, 10**6, 10**9, 1), None),
]


@pytest.mark.parametrize(("state", "limit"), BOUNDARIES)
def test_the_rule_refuses_at_vllms_boundaries(state, limit):
    max_reqs, max_tokens, num_reqs, num_tokens, n = state
    got = vllm_queue_limit(
        num_reqs, num_tokens, max_num_queued_reqs=max_reqs, max_num_queued_tokens=max_tokens, n=n
    )
    assert got == limit


def _cases() -> list[dict[str, Any]]:
    """Every limit setting (off, 0, tight, wider) against states on both sides of each boundary."""
    out = []
    for max_reqs, max_tokens in itertools.product((None, 0, 1, 4), (None, 0, 100)):
        for num_reqs, num_tokens, n in itertools.product((0, 1, 3, 4, 5), (0, 99, 100, 101), (1, 2)):
            out.append({"max_num_queued_reqs": max_reqs, "max_num_queued_tokens": max_tokens,
                        "num_reqs": num_reqs, "num_tokens": num_tokens, "n": n})  # fmt: skip
    return out


@pytest.mark.full
@pytest.mark.parallel  # the peer's script on given states: no port, no time
def test_the_rule_and_the_503_are_vllms(tmp_path):
    """vLLM's own `check_admission` on 480 states: the same refusals, counted under the same reasons,
    and for each the testbed's error body is the one vLLM's server makes (`create_error_response`)."""
    cases = _cases()
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    theirs = json.loads(run_script("admission.py", str(tmp_path / "cases.json")))
    assert {t["reason"] for t in theirs} == {None, *VLLM_QUEUE_LIMITS}
    for case, vllm in zip(cases, theirs, strict=True):
        ours = vllm_queue_limit(
            case["num_reqs"],
            case["num_tokens"],
            max_num_queued_reqs=case["max_num_queued_reqs"],
            max_num_queued_tokens=case["max_num_queued_tokens"],
            n=case["n"],
        )
        assert ours == vllm["reason"], case
        if ours is not None:
            answer = rejection("r", ours, "why")
            assert (answer.status, answer.headers) == (vllm["status"], None) == (503, None)
            assert answer.body() == vllm["body"], case


def test_the_gateways_refusals_stay_429s_with_retry_after():
    for limit in ("max_waiting", "max_queue_time_s"):
        answer = rejection("r7", limit, f"engine mixed-0: ... (scheduler.{limit})")
        assert answer.status == 429 and answer.headers == {"Retry-After": str(RETRY_AFTER_S)}
        assert limit in answer.message and answer.body()["error"]["type"] == "Too Many Requests"


def _request(rid: str, prompt_len: int, queued_s: float = 0.0) -> Request:
    return Request(EngineRequest(rid, [1] * prompt_len, 8), queued_s)


def _engine_state() -> tuple[Scheduler, Request]:
    """A scheduler holding requests of 10 to 40 prompt tokens (waiting; preempted after its first token
    at 0.5; running, its first token due at 2.0; loading remote KV), one of 1,000 tokens sent ahead to
    arrive at 3.0; and a 50-token request the scheduler let go whose output is due at 1.5."""
    scheduler = Scheduler(KVCacheCoordinator(64, 16, True), max_num_batched_tokens=512, max_num_seqs=8)
    waiting, preempted, running, loading = (_request(r, 10 * (i + 1)) for i, r in enumerate("wpRL"))
    preempted.output_token_ids, preempted.times.first_token_s = [5], 0.5
    running.times.first_token_s = 2.0
    scheduler.waiting.extend([waiting, preempted, _request("late", 1000, queued_s=3.0)])
    scheduler.running.append(running)
    scheduler.recving[loading.request_id] = loading
    finishing = _request("f", 50)
    finishing.status = RequestStatus.FINISHED
    finishing.times.first_token_s = finishing.times.finished_s = 1.5
    return scheduler, finishing


def _admission(**limits: int) -> Admission:
    scheduler, finishing = _engine_state()
    admission = Admission("mixed-0", scheduler=scheduler, **limits)
    admission.finished(finishing)
    return admission


def test_in_flight_and_in_prefill_are_as_vllms_api_server_sees_them_at_the_arrival():
    """In flight: queued by the arrival, not yet finished by it (a request whose last step ends after
    it still counts). In prefill: no token arrived by then; a preempted request that had one is not."""
    admission = _admission(max_num_queued_tokens=131)
    assert {r.request_id for r in admission.in_flight(1.0)} == set("wpRLf")
    assert admission.refusal(1.0) is None  # 10 + 30 + 40 + 50 = 130 in prefill
    assert {r.request_id for r in admission.in_flight(2.5)} == set("wpRL")
    tokens = _admission(max_num_queued_tokens=130)
    refused = tokens.refusal(1.0)
    assert refused is not None and refused.limit == "max_num_queued_tokens"
    assert refused.why == "engine mixed-0: 130 prompt tokens in prefill (scheduler.max_num_queued_tokens)"
    assert _admission(max_num_queued_tokens=51).refusal(2.5) is None  # w and L: 50
    assert _admission(max_num_queued_reqs=6).refusal(1.0) is None  # 5 in flight
    refused = _admission(max_num_queued_reqs=5).refusal(1.0)
    assert refused is not None and refused.limit == "max_num_queued_reqs"
    assert refused.why == "engine mixed-0: 5 requests in flight (scheduler.max_num_queued_reqs)"
    assert _admission(max_num_queued_reqs=5).refusal(2.5) is None  # f is out, `late` not in yet


def test_the_gateways_max_waiting_is_checked_before_vllms_limits():
    scheduler, _ = _engine_state()
    admission = Admission("mixed-0", scheduler=scheduler, max_waiting=3, max_num_queued_reqs=0)
    refused = admission.refusal(1.0)
    assert refused is not None and refused.limit == "max_waiting"


def _requests(arrivals: list[tuple[float, int, int]]) -> list[ClientRequest]:
    """A request per (arrival, prompt tokens, max_tokens), prompts of distinct tokens, answers forced."""
    return [ClientRequest(f"r{i}", t, [3 + i] * n, k, [9] * k) for i, (t, n, k) in enumerate(arrivals)]


def test_an_engine_refuses_past_max_num_queued_reqs_and_counts_the_reason():
    """Two in flight: a third arriving with them is refused (a `rejected` row naming the limit, nothing
    computed), and so is one arriving during their last step (they are in flight until its end); one
    arriving once they finished is served."""
    cfg = make_config(COLLOCATED, SKIP, scheduler={"max_num_queued_reqs": 2})
    arrivals = [(0.0, 100, 20), (0.0, 100, 20), (0.0, 100, 20), (30.0, 100, 20)]
    first, _ = run_requests(cfg, _requests(arrivals))
    last = first[0].token_times_s[-1]
    assert first[1].token_times_s[-1] == last
    results, dep = run_requests(cfg, _requests([*arrivals, (last - 1e-4, 100, 20)]))
    assert [r.finished_reason for r in results] == ["length", "length", "rejected", "length", "rejected"]
    refused = results[2]
    assert refused.rejected_by == "max_num_queued_reqs" and not refused.output_token_ids
    assert "2 requests in flight (scheduler.max_num_queued_reqs)" in (refused.error or "")
    _assert_counted(dep, max_num_queued_reqs=2, max_num_queued_tokens=0)


def test_an_engine_refuses_while_the_prompts_in_prefill_reach_max_num_queued_tokens():
    """99 + 1 prompt tokens in prefill: a request arriving with them is refused (100 >= 100). Once their
    first tokens are out (they decode on), a 150-token prompt is admitted (the new prompt's length does
    not matter); one arriving while its prefill step runs is refused (its first token is not out), one
    arriving after that step, admitted."""
    cfg = make_config(COLLOCATED, SKIP, scheduler={"max_num_queued_tokens": 100})
    arrivals = [(0.0, 99, 200), (0.0, 1, 200), (0.0, 5, 8), (1.0, 150, 8)]
    first, _ = run_requests(cfg, _requests(arrivals))
    times = first[3].times
    assert times is not None and times.first_scheduled_s is not None
    start, end = times.first_scheduled_s, first[3].token_times_s[0]
    assert first[0].token_times_s[0] < 1.0 < start < end < first[0].token_times_s[-1]
    results, dep = run_requests(cfg, _requests([*arrivals, (start + 1e-4, 5, 8), (end + 1e-4, 5, 8)]))
    reasons = [r.finished_reason for r in results]
    assert reasons == ["length", "length", "rejected", "length", "rejected", "length"]
    assert {results[2].rejected_by, results[4].rejected_by} == {"max_num_queued_tokens"}
    assert "100 prompt tokens in prefill" in (results[2].error or "")
    assert "150 prompt tokens in prefill" in (results[4].error or "")
    _assert_counted(dep, max_num_queued_reqs=0, max_num_queued_tokens=2)


def _assert_counted(dep: Any, **by_reason: int) -> None:
    expos = [metrics.exposition() for metrics in dep.engine_metrics]
    for reason, n in by_reason.items():
        assert sum_series(expos, m.ADMISSION_REJECTIONS.exposed, reason=reason) == n, reason
    assert sum(e.stats.num_rejected for e in dep.engines) == sum(by_reason.values())
