"""The testbed's scheduler step by step against vLLM's own (docs/conformance.md).

Generated, seeded scenarios (prompts from one token to several chunks, shared prefixes and repeats for
prefix-cache hits, KV small enough to preempt, several token budgets and `max_num_seqs`, arrivals
between steps, aborts) run through vLLM's v1 `Scheduler` alone (`vllm_peer_scripts/step_scheduler.py`,
in the vLLM peer's venv: `vllm_peer.py`) and through the testbed's `Scheduler` over its `KVCacheCoordinator`,
stepped the same way: arrivals added before the step they arrive at, aborts applied before it, one
fixed token for every request whose computed tokens caught up, `finish` at `max_tokens`. Each runs
with `reserve_full_isl` on (vLLM 0.32's default) and off. Pass: the same record at every step::

    {"step": k, "scheduled": {id: tokens}, "preempted": [ids in order], "finished": [ids, sorted],
     "free_blocks": n after the step, "admitted": {id: computed tokens (its prefix hit) when it left
     the waiting queue this step}}

vLLM is installed on first use (minutes); a machine that cannot install it skips with one line why.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from actors.engine.kv_cache.coordinator import KVCacheCoordinator
from actors.engine.request import Request, RequestStatus
from actors.engine.runner.tiny_model import ensure_model
from actors.engine.scheduling.scheduler import Scheduler
from emulation.config import RunnerConfig
from emulation.kv_cache import NUM_NULL_BLOCKS
from messages import EngineRequest
from tests.vllm_peer import Scenario, run_script, scheduler_scenario, vllm_version

pytestmark = [
    pytest.mark.full,
    pytest.mark.timeout(2400),  # the first test may install vLLM (minutes)
    pytest.mark.parallel,  # the peer's script and the testbed's engine, stepped: no time is checked
]

Record = dict[str, Any]

BLOCK_SIZE = 16
TOKEN = 7
"""The token every caught-up request samples on both sides (the peer script's `TOKEN`)."""
SEEDS = range(16)
RESERVE_FULL_ISL = (True, False)


def make_scenario(seed: int, reserve_full_isl: bool) -> Scenario:
    """One seeded scenario, in the peer script's format; every request fits the KV cache alone, so
    both sides finish (`reserve_full_isl` never waits forever)."""
    rng = random.Random(seed)
    budget = rng.choice([16, 32, 48, 64, 128, 256])
    num_gpu_blocks = rng.choice([12, 17, 24, 33, 48])
    capacity = (num_gpu_blocks - NUM_NULL_BLOCKS) * BLOCK_SIZE

    def fresh(n: int) -> list[int]:
        return [rng.randrange(10, 8000) for _ in range(n)]

    prefixes = [fresh(BLOCK_SIZE * rng.randint(1, 4) + rng.choice([0, 5])) for _ in range(2)]
    requests: list[dict[str, Any]] = []
    step = 0
    for i in range(rng.randint(8, 14)):
        max_tokens = rng.randint(1, 24)
        # under a block, up to a chunk, or several chunks
        size = rng.choice([rng.randint(1, 15), rng.randint(16, budget), rng.randint(budget + 1, 4 * budget)])
        kind = rng.random()
        if kind < 0.35:  # a shared system prompt, then its own
            prompt = rng.choice(prefixes) + fresh(size)
        elif kind < 0.5 and requests:  # a repeat: hits all but its last (partial) block
            prompt = list(rng.choice(requests)["prompt_token_ids"])
        else:
            prompt = fresh(size)
        step += rng.choice([0, 0, 0, 1, 1, 3, 6])
        requests.append(_request(f"r{i}", prompt[: capacity - max_tokens], max_tokens, step))
    aborted = rng.sample(requests, rng.randint(1, 2))
    aborts = [{"id": r["id"], "step": r["arrival_step"] + rng.randint(0, 12)} for r in aborted]
    max_num_seqs = min(budget, rng.choice([2, 3, 4, 8, 16]))
    sc = _scenario(f"seed-{seed}", num_gpu_blocks, budget, max_num_seqs, reserve_full_isl, requests, aborts)
    sc["enable_prefix_caching"] = rng.random() < 0.75
    return sc


def _request(rid: str, prompt: list[int], max_tokens: int, arrival_step: int) -> dict[str, Any]:
    return {"id": rid, "prompt_token_ids": prompt, "max_tokens": max_tokens, "arrival_step": arrival_step}


def _scenario(
    name: str,
    num_gpu_blocks: int,
    budget: int,
    max_num_seqs: int,
    reserve_full_isl: bool,
    requests: list[dict[str, Any]],
    aborts: list[dict[str, Any]] | None = None,
) -> Scenario:
    return scheduler_scenario(
        name,
        requests,
        block_size=BLOCK_SIZE,
        num_gpu_blocks=num_gpu_blocks,
        budget=budget,
        max_num_seqs=max_num_seqs,
        reserve_full_isl=reserve_full_isl,
        aborts=aborts,
    )


def _tokens(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def hits_blocks_scheduled_this_step(reserve_full_isl: bool) -> Scenario:
    """Two identical 40-token prompts arrive together: the second is admitted in the step that
    computes the first's two full blocks."""
    same = _tokens(100, 40)
    requests = [_request("r0", same, 2, 0), _request("r1", list(same), 2, 0)]
    return _scenario("hits-blocks-scheduled-this-step", 21, 128, 4, reserve_full_isl, requests)


def reuses_partial_blocks_first(reserve_full_isl: bool) -> Scenario:
    """4 usable blocks. r0 (a cached 16-token prefix + 4) and r1 (40 fresh) finish, each freeing a
    partly filled last block; r2 takes one block; r3 then shares r0's prefix. vLLM 0.32 frees a block
    without a hash to the front of the free queue (reused first), one with a hash to the back."""
    prefix = _tokens(100, 16)
    requests = [
        _request("r0", prefix + _tokens(500, 4), 1, 0),
        _request("r1", _tokens(1000, 40), 1, 1),
        _request("r2", _tokens(2000, 10), 1, 2),
        _request("r3", prefix + _tokens(3000, 8), 1, 3),
    ]
    return _scenario("reuses-partial-blocks-first", 5, 64, 4, reserve_full_isl, requests)


def failed_admission_keeps_lru_order(reserve_full_isl: bool) -> Scenario:
    """5 usable blocks. r0 (a 32-token prefix) and r1 (16 tokens) finish, their blocks cached and
    free; r2 takes two blocks and grows; r3 (the prefix + 40) hits r0's blocks but does not fit for
    three steps, while r2 takes one more block. In vLLM a failed admission leaves its hits where they
    are in the free queue (r2 evicts one of them); r3 then hits less."""
    prefix = _tokens(100, 32)
    requests = [
        _request("r0", prefix, 1, 0),
        _request("r1", _tokens(500, 16), 1, 0),
        _request("r2", _tokens(1000, 32), 3, 1),
        _request("r3", prefix + _tokens(2000, 40), 1, 1),
    ]
    return _scenario("failed-admission-keeps-lru-order", 6, 64, 4, reserve_full_isl, requests)


NAMED = {
    f.__name__.replace("_", "-"): f
    for f in (hits_blocks_scheduled_this_step, reuses_partial_blocks_first, failed_admission_keeps_lru_order)
}
"""Hand-made scenarios, each a minimal case of one vLLM 0.32 prefix-cache behaviour (each once differed)."""
NAMES = [f"seed-{seed}" for seed in SEEDS] + list(NAMED)


def scenario(name: str, reserve_full_isl: bool) -> Scenario:
    """A scenario by name: `seed-<n>` (generated) or one of `NAMED`."""
    if name.startswith("seed-"):
        return make_scenario(int(name.removeprefix("seed-")), reserve_full_isl)
    return NAMED[name](reserve_full_isl)


class EmulatedSide:
    """The testbed's `Scheduler` over its `KVCacheCoordinator` for one scenario, stepped as the peer script
    steps vLLM's (its `run` loop), one record per step."""

    def __init__(self, sc: Scenario, reserve_full_isl: bool) -> None:
        self.sc = sc
        self.blocks = KVCacheCoordinator(
            sc["num_gpu_blocks"] - NUM_NULL_BLOCKS, sc["block_size"], sc["enable_prefix_caching"]
        )
        self.sched = Scheduler(
            self.blocks,
            max_num_batched_tokens=sc["max_num_batched_tokens"],
            max_num_seqs=sc["max_num_seqs"],
            reserve_full_isl=reserve_full_isl,
        )
        self.requests: dict[str, Request] = {}

    def arrive_and_abort(self, step: int) -> list[str]:
        """Add the requests arriving at `step` (seen from `step` on), then apply its aborts; the ids
        the aborts finished."""
        for spec in self.sc["requests"]:
            if spec["arrival_step"] == step:
                engine_request = EngineRequest(spec["id"], list(spec["prompt_token_ids"]), spec["max_tokens"])
                self.requests[spec["id"]] = req = Request(engine_request, float(step))
                self.sched.add(req)
        aborted = []
        for abort in self.sc["aborts"]:
            target = self.requests.get(abort["id"]) if abort["step"] == step else None
            if target is not None and target.status is not RequestStatus.FINISHED:
                self.sched.finish(target, "abort")
                aborted.append(target.request_id)
        return aborted

    def step(self, step: int) -> Record:
        aborted = self.arrive_and_abort(step)
        running = {r.request_id for r in self.sched.running}
        batch = self.sched.schedule(float(step))
        ids = [r.request_id for r in batch.requests]
        admitted = {
            r.request_id: r.num_computed_tokens for r in batch.requests if r.request_id not in running
        }
        stopped = []
        for req, _, reason in self.sched.update_from_output(batch, [TOKEN] * len(ids), float(step), 1.0):
            if reason is not None:  # `length`: at max_tokens
                self.sched.finish(req, reason)
                stopped.append(req.request_id)
        return {
            "step": step,
            "scheduled": dict(zip(ids, batch.num_new_tokens, strict=True)),
            "preempted": [r.request_id for r in batch.preempted],
            "finished": sorted(aborted + stopped),
            "free_blocks": self.blocks.num_free_blocks,
            "admitted": admitted,
        }


def run_testbed(sc: Scenario, reserve_full_isl: bool | None = None) -> list[Record]:
    """The testbed's records for `sc`, step by step until every request arrived and finished.

    `reserve_full_isl` overrides the scenario's on this side only (to show the comparison can fail)."""
    side = EmulatedSide(sc, sc["reserve_full_isl"] if reserve_full_isl is None else reserve_full_isl)
    return step_until_done(side, sc)


def step_until_done(side: EmulatedSide, sc: Scenario) -> list[Record]:
    """`side`'s records, a step at a time until every request of `sc` arrived and finished."""
    last_arrival = max(r["arrival_step"] for r in sc["requests"])
    records = []
    for step in range(sc["max_steps"]):
        records.append(side.step(step))
        if step >= last_arrival and not side.sched.num_unfinished:
            break
    return records


def _compact(record: Record) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def first_difference(sc: Scenario, theirs: list[Record], ours: list[Record]) -> str | None:
    """None if the two step lists are identical; else both sides' first differing step, compactly."""
    head = (
        f"{sc['name']}, reserve_full_isl={sc['reserve_full_isl']} ({sc['num_gpu_blocks']} blocks of "
        f"{sc['block_size']}, budget {sc['max_num_batched_tokens']}, max_num_seqs {sc['max_num_seqs']}, "
        f"prefix caching {'on' if sc['enable_prefix_caching'] else 'off'}, {len(sc['requests'])} requests): "
    )
    for i, (a, b) in enumerate(zip(theirs, ours, strict=False)):
        if a != b:
            fields = ", ".join(k for k in a if a[k] != b.get(k))
            lines = [
                f"{head}first difference at step {i} (of {len(theirs)} vLLM / {len(ours)} testbed steps), "
                f"in {fields}",
                f"  vLLM    {_compact(a)}",
                f"  testbed {_compact(b)}",
            ]
            if i > 0:
                lines.append(f"  step {i - 1}, the same on both: {_compact(theirs[i - 1])}")
            return "\n".join(lines)
    if len(theirs) != len(ours):
        n = min(len(theirs), len(ours))
        longer, side = (theirs, "vLLM") if len(theirs) > n else (ours, "testbed")
        return f"{head}the same for {n} steps, then only {side} goes on: {_compact(longer[n])}"
    return None


ALL = [(name, reserve) for reserve in RESERVE_FULL_ISL for name in NAMES]


@pytest.fixture(scope="module")
def vllm_records(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, bool], list[Record]]:
    """Every scenario through vLLM's scheduler, in one run of the peer script."""
    work = tmp_path_factory.mktemp("vllm-peer")
    model = work / "model"  # just the tiny runner's config.json: vLLM builds its model config from it
    model.mkdir()
    shutil.copy(Path(ensure_model(RunnerConfig())) / "config.json", model / "config.json")
    (work / "scenarios.json").write_text(json.dumps([scenario(*key) for key in ALL]))
    out = run_script("step_scheduler.py", str(model), str(work / "scenarios.json"))
    return dict(zip(ALL, json.loads(out), strict=True))


@pytest.mark.parametrize("reserve_full_isl", RESERVE_FULL_ISL, ids=lambda r: f"reserve_full_isl={r}")
@pytest.mark.parametrize("name", NAMES)
def test_scheduler_steps_as_vllm_does(name, reserve_full_isl, vllm_records):
    sc = scenario(name, reserve_full_isl)
    diff = first_difference(sc, vllm_records[name, reserve_full_isl], run_testbed(sc))
    assert diff is None, f"testbed != vLLM {vllm_version()}: {diff}"


def test_the_scenarios_exercise_what_they_claim(vllm_records):
    """On vLLM's side, the generated scenarios together preempt, hit the prefix cache, abort requests,
    chunk prefills beside decodes, and use several budgets, KV sizes and `max_num_seqs`."""
    generated = {key: records for key, records in vllm_records.items() if key[0].startswith("seed-")}
    steps = [r for records in generated.values() for r in records]
    assert any(r["preempted"] for r in steps), "no preemption"
    assert any(hit > 0 for r in steps for hit in r["admitted"].values()), "no prefix-cache hit"
    took_effect = [
        abort["id"] in records[abort["step"]]["finished"]
        for key, records in generated.items()
        for abort in scenario(*key)["aborts"]
        if abort["step"] < len(records)
    ]
    assert any(took_effect), "no abort took effect"
    assert any(len(r["scheduled"]) > 1 and max(r["scheduled"].values()) > 1 for r in steps), "no mixed batch"
    configs = [scenario(name, True) for name in NAMES if name.startswith("seed-")]
    for knob in ("max_num_batched_tokens", "num_gpu_blocks", "max_num_seqs"):
        assert len({sc[knob] for sc in configs}) >= 3, f"too few values of {knob}"


def test_a_one_sided_flip_of_reserve_full_isl_is_caught(vllm_records):
    """The comparison is not vacuous: the testbed with `reserve_full_isl` flipped (vLLM's left as is)
    differs from vLLM in some scenario of each setting."""
    for reserve in RESERVE_FULL_ISL:
        diffs = [
            first_difference(sc, vllm_records[name, reserve], run_testbed(sc, reserve_full_isl=not reserve))
            for name in NAMES
            for sc in [scenario(name, reserve)]
        ]
        assert any(diffs), f"flipping reserve_full_isl={reserve} on the testbed's side changed nothing"
