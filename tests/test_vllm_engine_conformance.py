"""The testbed's engine against vLLM's whole engine, both computing with the same runner model.

`tests/test_vllm_conformance.py` steps vLLM's `Scheduler` alone with made-up tokens; this file runs
vLLM's engine (`LLM(...).llm_engine`, in process, `vllm_peer_scripts/step_engine.py`) and the testbed's
`EngineCore` (`engine_lockstep.py`: a virtual loop, every step one emulated second, real compute) on
the same seeded scenarios: prompt lengths around the block size of 32, shared prefixes and repeats,
KV small enough to preempt (prefix caching off and on), chunked prefill at budgets of 32, 64 and 128,
`max_num_seqs` limits, arrivals between steps; and `test_vllm_metric_families.py`'s traffic, arriving
at once and in pairs (several preemptions in a step, resumed requests). Both load the same weights: the
testbed's tiny Qwen2 runner with 2 query heads and 1 KV head (head_dim 32, hidden 64; vLLM's CPU
attention wants a head size it has kernels for), seeded, `save_pretrained` by `ensure_model`. Greedy
decoding, `ignore_eos`.

What passes:
  (a) steps: the testbed's record at every step equals vLLM's (`test_vllm_conformance.py`'s record:
      tokens per request, preemptions, finished, free blocks, admitted with its prefix hit), and each
      request emits each token at the same step. Macro steps (`runner.macro_steps`) only run without
      real compute, so the comparison for them is a second testbed run with compute skip, each request
      forced to the tokens the real run produced: a window collapses steps into one `schedule` call,
      so its records are not comparable, but every request's outcome (its tokens, the step of each,
      its finish, prefix hit and preemptions) must equal the single steps', and windows must have run.
  (b) tokens: the testbed's greedy tokens against vLLM's. Both compute in float32 on the CPU, with
      different kernels (vLLM's CPU attention and fused ops; the testbed's torch SDPA and the model's
      modules), so logits differ in the last bits, and greedy decoding flips where two tokens tie to
      within that. Up to the first difference, the continuations are the same; after it they are
      continuations of different texts. So: every request agrees up to its first difference, which
      must be a near tie in vLLM's own logits (the testbed's token is vLLM's second choice, less than
      `TIE_MARGIN` below its first), and at least `MIN_AGREEMENT` of all positions agree. And vLLM's
      top two log-probabilities at every position equal the runner model's own `forward`.
A last test shows the comparisons can fail: vLLM's second choice where it was no near tie, or fewer
request slots on the testbed's side, are caught.

The peer runs once for all scenarios (vLLM's import, then an `LLM` per scenario: about 65 s here);
the testbed's side takes about a second. A machine that cannot install vLLM skips with one line why.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from typing import Any

import pytest
import torch

from actors.engine.runner.tiny_model import ensure_model, load_model
from emulation.config import RunnerConfig
from emulation.kv_cache import NUM_NULL_BLOCKS
from tests.engine_lockstep import EngineRun, Scenario, run_engine
from tests.test_vllm_conformance import first_difference
from tests.test_vllm_metric_families import LIMITS, traffic
from tests.vllm_peer import run_script, vllm_version

pytestmark = [
    pytest.mark.full,
    pytest.mark.timeout(2400),  # the first test may install vLLM (minutes)
    pytest.mark.parallel,  # the peer's script and the testbed's engine, stepped: no time is checked
]

BLOCK_SIZE = 32
RUNNER: dict[str, Any] = {"num_heads": 2, "num_kv_heads": 1}
"""The runner model both engines load (`RunnerConfig` fields over its defaults: hidden 64, 2 layers)."""
TIE_MARGIN = 1e-4
"""Largest gap between vLLM's first and second choice (in logits: a log-probability difference) that
counts as a near tie: a hundred times the largest difference between the two's log-probabilities."""
LOGPROB_ATOL = 1e-5
"""Largest difference allowed between vLLM's log-probabilities and the runner model's own (measured:
about 1e-6, float32's resolution at their magnitude, about 9 = ln 8192)."""
MIN_AGREEMENT = 0.9
"""Share of all generated positions that must agree (each request's, up to its first difference)."""


def _scenario(
    name: str, num_gpu_blocks: int, budget: int, max_num_seqs: int, prefix_caching: bool, requests: list[Any]
) -> Scenario:
    """A scenario in the peer script's format; `requests`: (prompt, max_tokens, arrival_step)."""
    return {
        "name": name,
        "block_size": BLOCK_SIZE,
        "num_gpu_blocks": num_gpu_blocks,
        "max_num_batched_tokens": budget,
        "max_num_seqs": max_num_seqs,
        "max_model_len": min(2048, (num_gpu_blocks - NUM_NULL_BLOCKS) * BLOCK_SIZE),  # vLLM: one fits
        "enable_prefix_caching": prefix_caching,
        "reserve_full_isl": True,
        "requests": [
            {"id": f"r{i}", "prompt_token_ids": p, "max_tokens": m, "arrival_step": a}
            for i, (p, m, a) in enumerate(requests)
        ],
        "max_steps": 2000,
    }


def _fresh(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 8000) for _ in range(n)]


def prompt_lengths(seed: int = 0) -> Scenario:
    """One token to several chunks (around the block size), arriving over ten steps; budget 64."""
    rng = random.Random(seed)
    shapes = [
        (5, 12, 0),
        (31, 6, 0),
        (32, 9, 1),
        (33, 4, 1),
        (100, 10, 2),
        (1, 8, 4),
        (200, 6, 5),
        (64, 16, 9),
    ]
    return _scenario("prompt-lengths", 33, 64, 8, True, [(_fresh(rng, n), m, a) for n, m, a in shapes])


def shared_prefixes(seed: int = 1) -> Scenario:
    """Two system prompts (two blocks; one block and 8) shared by later requests, exact repeats (one
    of exactly three blocks, whose hit stops a block short: a token must be computed); budget 128.
    Each request arrives after the blocks it hits were computed."""
    rng = random.Random(seed)
    system, other = _fresh(rng, 64), _fresh(rng, 40)
    r0, r4 = system + _fresh(rng, 20), system + _fresh(rng, 32)
    requests = [
        (r0, 8, 0),
        (system + _fresh(rng, 50), 6, 2),
        (other + _fresh(rng, 30), 5, 2),
        (list(r0), 7, 6),
        (r4, 9, 3),
        (list(r4), 4, 8),
        (other + _fresh(rng, 60), 6, 7),
    ]
    return _scenario("shared-prefixes", 49, 128, 8, True, requests)


def same_step_hits(seed: int = 5) -> Scenario:
    """Two identical 100-token prompts and one sharing their first two blocks arrive together: vLLM
    caches blocks as it schedules them, so the later two hit blocks the first computes in the same
    step (with real compute, they read KV written in that very step)."""
    rng = random.Random(seed)
    same = _fresh(rng, 100)
    requests = [
        (same, 6, 0),
        (list(same), 6, 0),
        (same[:64] + _fresh(rng, 10), 5, 0),
        (_fresh(rng, 20), 4, 1),
    ]
    return _scenario("same-step-hits", 17, 128, 4, True, requests)


def kv_pressure(prefix_caching: bool, seed: int = 2) -> Scenario:
    """Eight usable blocks for four requests whose decodes outgrow them: preemptions, recomputation."""
    rng = random.Random(seed)
    shapes = [(60, 40, 0), (50, 40, 0), (40, 30, 1), (20, 30, 2), (45, 10, 6)]
    name = f"kv-pressure-{'cached' if prefix_caching else 'uncached'}"
    return _scenario(name, 9, 64, 8, prefix_caching, [(_fresh(rng, n), m, a) for n, m, a in shapes])


def small_budget(seed: int = 3) -> Scenario:
    """A budget of one block and two running requests at most: long prompts in 32-token chunks beside
    decodes, later requests waiting for a place."""
    rng = random.Random(seed)
    shapes = [(150, 6, 0), (90, 8, 0), (40, 5, 1), (10, 12, 2), (70, 4, 4)]
    return _scenario("small-budget", 25, 32, 2, True, [(_fresh(rng, n), m, a) for n, m, a in shapes])


def many_at_once(seed: int = 4) -> Scenario:
    """Eight requests at once with `max_num_seqs` 3, two more later (one of 250 tokens); budget 128."""
    rng = random.Random(seed)
    shapes = [(rng.randint(8, 120), rng.randint(3, 20), 0) for _ in range(8)] + [(50, 5, 5), (250, 7, 5)]
    return _scenario("many-at-once", 33, 128, 3, True, [(_fresh(rng, n), m, a) for n, m, a in shapes])


def metric_families_traffic(arrival_steps: list[int], name: str) -> Scenario:
    """`test_vllm_metric_families.py`'s traffic under its limits (`max_model_len` 512): eight 168-token
    prompts sharing four blocks, 120 tokens each, 19 usable blocks, budget 512. Decodes outgrow the
    blocks: requests are preempted, the newest first, and come back with hits on their own blocks.
    `arrival_steps`: each request's. All 0 is how that test's vLLM side sends them (`LLM.generate`
    adds every request before the first step): seven are admitted at step 0, six hitting the prefix
    the first computes in it, and one step preempts two. Two at step 0 and six at step 1 is how the
    testbed's replay delivers them with the render tier's default costs (two replicas, 0.31 ms a
    prompt; the first step starts when the first two are rendered): two steps preempt one each, one
    preemption more in all (6, not 5), and the last request is preempted the step after its admission."""
    requests = [
        (r["prompt_token_ids"], r["max_tokens"], a) for r, a in zip(traffic(), arrival_steps, strict=True)
    ]
    sc = _scenario(
        name,
        LIMITS["num_gpu_blocks"],
        LIMITS["max_num_batched_tokens"],
        LIMITS["max_num_seqs"],
        True,
        requests,
    )
    return {**sc, "max_model_len": LIMITS["max_model_len"]}


SCENARIOS = {
    sc["name"]: sc
    for sc in (
        prompt_lengths(),
        shared_prefixes(),
        same_step_hits(),
        kv_pressure(False),
        kv_pressure(True),
        small_budget(),
        many_at_once(),
        metric_families_traffic([0] * 8, "metric-families-at-once"),
        metric_families_traffic([0, 0, 1, 1, 1, 1, 1, 1], "metric-families-in-pairs"),
    )
}
NAMES = list(SCENARIOS)


@pytest.fixture(scope="module")
def vllm_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every scenario through vLLM's engine, in one run of the peer script."""
    model = ensure_model(RunnerConfig(**RUNNER))
    path = tmp_path_factory.mktemp("vllm-engine") / "scenarios.json"
    path.write_text(json.dumps(list(SCENARIOS.values())))
    out = run_script("step_engine.py", str(model), str(path))
    return dict(zip(NAMES, json.loads(out), strict=True))


@pytest.fixture(scope="module")
def testbed_runs() -> dict[str, EngineRun]:
    """Every scenario through the testbed's engine: real compute, a step at a time."""
    return {name: run_engine(sc, RUNNER) for name, sc in SCENARIOS.items()}


@pytest.mark.parametrize("name", NAMES)
def test_engine_steps_as_vllm_does(name, vllm_runs, testbed_runs):
    """(a) The same record at every step, and every token emitted at the same step, with the same hit."""
    sc, theirs, ours = SCENARIOS[name], vllm_runs[name], testbed_runs[name]
    diff = first_difference(sc, theirs["records"], ours.records)
    assert diff is None, f"testbed engine != vLLM {vllm_version()} engine: {diff}"
    for rid, o in ours.outcomes.items():
        v = theirs["outputs"][rid]
        assert (o.token_steps, o.num_cached_tokens) == (v["token_steps"], v["num_cached_tokens"]), rid


@pytest.mark.parametrize("name", NAMES)
def test_macro_steps_give_what_single_steps_give(name, testbed_runs):
    """(a) Macro steps need compute skip: each request forced to the tokens real compute gave it. A
    step at a time, compute skip schedules as real compute did; with windows, fewer `schedule` calls
    make the same tokens at the same steps, with the same finishes, hits and preemptions."""
    sc, real = SCENARIOS[name], testbed_runs[name]
    forced = {rid: o.token_ids for rid, o in real.outcomes.items()}
    single = run_engine(sc, RUNNER, compute="skip", macro_steps=False, forced=forced)
    assert first_difference(sc, real.records, single.records) is None
    windows = run_engine(sc, RUNNER, compute="skip", macro_steps=True, forced=forced)
    assert windows.outcomes == real.outcomes
    assert windows.num_schedules < len(real.records), "no window ran: the comparison would prove nothing"


def divergences(vllm_runs: dict[str, Any], testbed_runs: dict[str, EngineRun]) -> tuple[int, int, list[str]]:
    """Positions agreeing (each request's, up to its first difference), positions in all, and the
    first differences that are not near ties in vLLM's logits (the testbed's token is not vLLM's
    second choice, or lies `TIE_MARGIN` or more below its first)."""
    agreeing = total = 0
    unexplained = []
    for name, run in testbed_runs.items():
        for rid, o in run.outcomes.items():
            v = vllm_runs[name]["outputs"][rid]
            ours, theirs = o.token_ids, v["token_ids"]
            assert len(ours) == len(theirs), (name, rid)
            i = next((k for k, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), len(ours))
            agreeing, total = agreeing + i, total + len(ours)
            if i < len(ours):
                first, lp1, second, lp2 = v["top2"][i]
                margin = lp1 - lp2
                print(f"{name} {rid}: first difference at token {i} of {len(ours)}, vLLM margin {margin:.2e}")
                if (first, second) != (theirs[i], ours[i]) or margin >= TIE_MARGIN:
                    unexplained.append(
                        f"{name} {rid} token {i}: testbed {ours[i]}, vLLM's top two {v['top2'][i]}"
                    )
    return agreeing, total, unexplained


def test_greedy_tokens_agree_with_vllm(vllm_runs, testbed_runs):
    """(b) Every request's greedy tokens agree up to a first difference that is a near tie."""
    agreeing, total, unexplained = divergences(vllm_runs, testbed_runs)
    print(f"greedy tokens: {agreeing} of {total} positions agree")
    assert not unexplained, "differences that are no near tie:\n" + "\n".join(unexplained)
    assert agreeing >= MIN_AGREEMENT * total, f"only {agreeing} of {total} positions agree"


def test_a_changed_token_or_limit_is_caught(vllm_runs, testbed_runs):
    """The comparisons are not vacuous: vLLM's second choice where it was no near tie, or three
    request slots less, differ from vLLM."""
    name = "prompt-lengths"
    run = testbed_runs[name]
    changed = {rid: dataclasses.replace(o, token_ids=[*o.token_ids]) for rid, o in run.outcomes.items()}
    changed["r4"].token_ids[3] = vllm_runs[name]["outputs"]["r4"]["top2"][3][2]
    _, _, unexplained = divergences({name: vllm_runs[name]}, {name: EngineRun(run.records, changed)})
    assert len(unexplained) == 1 and "r4 token 3" in unexplained[0]
    fewer = {**SCENARIOS[name], "max_num_seqs": SCENARIOS[name]["max_num_seqs"] - 3}
    assert first_difference(fewer, vllm_runs[name]["records"], run_engine(fewer, RUNNER).records) is not None


def test_logprobs_are_the_runner_models(vllm_runs):
    """(b) vLLM computes the runner model's function: its top two log-probabilities at every sampled
    position equal the model's own `forward` (transformers, which `test_runner.py` pins the testbed's
    runner to) on the same tokens, to within `LOGPROB_ATOL`."""
    model = load_model(RunnerConfig(**RUNNER))
    worst = 0.0
    with torch.inference_mode():
        for name, sc in SCENARIOS.items():
            for spec in sc["requests"]:
                v = vllm_runs[name]["outputs"][spec["id"]]
                n = len(spec["prompt_token_ids"])
                logits = model(torch.tensor([spec["prompt_token_ids"] + v["token_ids"]])).logits[0]
                logprobs = torch.log_softmax(logits[n - 1 : -1], dim=-1)
                for row, (t1, lp1, t2, lp2) in zip(logprobs, v["top2"], strict=True):
                    worst = max(worst, abs(row[t1].item() - lp1), abs(row[t2].item() - lp2))
    print(f"largest difference of a top-two log-probability: {worst:.1e}")
    assert worst < LOGPROB_ATOL


def test_the_scenarios_exercise_what_they_claim(vllm_runs):
    """On vLLM's side: preemptions with prefix caching off and on (a resumed request hitting its own
    blocks), prefix hits (some in the step that computes their blocks), prompts chunked at three
    budgets, `max_num_seqs` full while a request waited, arrivals at several steps; the metric-families
    traffic preempting two requests in one step when it arrives at once, more in all when it arrives in
    pairs, one of them the step after its admission."""
    records = {name: run["records"] for name, run in vllm_runs.items()}
    for name in ("kv-pressure-uncached", "kv-pressure-cached"):
        assert any(r["preempted"] for r in records[name]), f"{name}: no preemption"
    preempted = {rid for r in records["kv-pressure-cached"] for rid in r["preempted"]}
    resumed = [
        r["admitted"][rid] for r in records["kv-pressure-cached"] for rid in preempted & set(r["admitted"])
    ]
    assert any(hit > 0 for hit in resumed), "no resumed request hit its own blocks"
    assert any(hit > 0 for hit in records["same-step-hits"][0]["admitted"].values()), "no same-step hit"
    hits = [hit for rs in records.values() for r in rs for hit in r["admitted"].values()]
    assert sum(hit > 0 for hit in hits) >= 8, "too few prefix hits"
    chunked = set()  # budgets at which a prompt was admitted with a chunk short of what it lacked
    for name, rs in records.items():
        prompts = {spec["id"]: len(spec["prompt_token_ids"]) for spec in SCENARIOS[name]["requests"]}
        if any(
            n < prompts[rid] - hit
            for r in rs
            for rid, hit in r["admitted"].items()
            for n in [r["scheduled"][rid]]
        ):
            chunked.add(SCENARIOS[name]["max_num_batched_tokens"])
    assert len(chunked) >= 3, f"prompts chunked at budgets {sorted(chunked)} only"
    for name in ("small-budget", "many-at-once"):
        sc = SCENARIOS[name]
        admitted = {
            rid: min(r["step"] for r in records[name] if rid in r["admitted"])
            for rid in vllm_runs[name]["outputs"]
        }
        waiting = [
            r["step"]
            for r in records[name]
            if len(r["scheduled"]) == sc["max_num_seqs"]
            and any(spec["arrival_step"] <= r["step"] < admitted[spec["id"]] for spec in sc["requests"])
        ]
        assert waiting, f"{name}: max_num_seqs never held a request back"
    arrivals = {spec["arrival_step"] for sc in SCENARIOS.values() for spec in sc["requests"]}
    assert len(arrivals) >= 6
    at_once, in_pairs = records["metric-families-at-once"], records["metric-families-in-pairs"]
    assert any(len(r["preempted"]) >= 2 for r in at_once), "no step preempted two requests"
    num_preempted = [sum(len(r["preempted"]) for r in rs) for rs in (at_once, in_pairs)]
    assert num_preempted[0] < num_preempted[1], f"preemptions at once, in pairs: {num_preempted}"
    assert any(
        rid in before["admitted"]
        for before, r in itertools.pairwise(in_pairs)
        if r["step"] == before["step"] + 1
        for rid in r["preempted"]
    ), "no request preempted the step after its admission"
