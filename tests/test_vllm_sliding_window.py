"""Sliding-window KV freeing against vLLM's own `SlidingWindowManager`, op by op.

vLLM 0.32's `KVCacheManager` runs in the vLLM peer's venv (`vllm_peer_scripts/step_sliding_window.py`:
prefix caching off, its own `allocate_slots` and `free`), over one full-attention and one sliding-window
KV cache group of one block size, gpt-oss's layout. The testbed's `KVCacheCoordinator` with a
`SlidingWindowSpec` runs the same allocate and free ops, as its scheduler makes them: a request's first
allocate is its admission (the whole sequence must fit, vLLM's `scheduler_reserve_full_isl`), later ones
its prefill chunks and decodes. After every op both must agree on whether it fitted, the free blocks,
each group's table length and where the sliding group holds null blocks (those that left the window).

Block ids are not compared: vLLM's groups take blocks in group order, the testbed's coordinator takes a
sliding group's before full attention's, so the same blocks go to the other group.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from actors.engine.kv_cache.coordinator import KVCacheCoordinator
from actors.engine.kv_cache.sliding_window import SlidingWindowManager, SlidingWindowSpec
from actors.engine.request import Request
from emulation.kv_cache import NUM_NULL_BLOCKS, max_window_blocks
from messages import EngineRequest
from tests.vllm_peer import run_script

pytestmark = [
    pytest.mark.full,
    pytest.mark.timeout(2400),  # the first test may install vLLM (minutes)
    pytest.mark.parallel,  # the peer's script and the testbed's manager, op by op: no time is checked
]

Op = dict[str, Any]


def scenario(
    name: str, ops: list[Op], *, block_size: int, window: int, num_blocks: int, budget: int
) -> dict[str, Any]:
    return {
        "name": name,
        "block_size": block_size,
        "sliding_window": window,
        "num_blocks": num_blocks + NUM_NULL_BLOCKS,  # vLLM's count has its null block
        "groups": ["full", "sliding"],
        "max_num_batched_tokens": budget,
        "ops": ops,
    }


def coordinator_for(sc: dict[str, Any]) -> tuple[KVCacheCoordinator, SlidingWindowManager]:
    """The coordinator a gpt-oss-like target gets for the scenario (`cluster/engines.py`), prefix caching
    off as in the peer, and its sliding-window manager."""
    spec = SlidingWindowSpec(sc["sliding_window"], 1, sc["max_num_batched_tokens"])
    coordinator = KVCacheCoordinator(
        sc["num_blocks"] - NUM_NULL_BLOCKS, sc["block_size"], False, specs=[spec]
    )
    return coordinator, next(m for m in coordinator.managers if isinstance(m, SlidingWindowManager))


def generated(seed: int) -> dict[str, Any]:
    """Requests arriving, each a prompt in chunks of the budget then decodes, interleaved step by step,
    finished or dropped mid-way (a free), under a KV cache that sometimes refuses: a refused step is
    tried again later, as a scheduler tries it again (the testbed's outcomes decide the ops; vLLM must
    then agree on each)."""
    rng = random.Random(seed)
    bs, window, budget = rng.choice([(16, 128, 64), (16, 100, 48), (4, 30, 16)])
    sc = scenario(
        f"seed{seed}", [], block_size=bs, window=window, num_blocks=rng.randint(12, 40), budget=budget
    )
    coordinator, _ = coordinator_for(sc)
    live: dict[str, tuple[Request, int]] = {}  # request -> (its request, its prompt's length)
    for i in range(60):
        if len(live) < 3 and rng.random() < 0.4:
            prompt = rng.randint(1, 6 * window)
            total = prompt + rng.randint(1, 2 * window)
            live[f"r{i}"] = (Request(EngineRequest(f"r{i}", list(range(total)), 1), 0.0), prompt)
        if not live:
            continue
        rid = rng.choice(sorted(live))
        req, prompt = live[rid]
        computed = req.num_computed_tokens
        if computed >= req.num_tokens or (computed and rng.random() < 0.04):
            sc["ops"].append({"op": "free", "req": rid})
            coordinator.free(req)
            del live[rid]
            continue
        new = min(budget, prompt - computed) if computed < prompt else 1
        op = {"op": "allocate", "req": rid, "num_computed_tokens": computed, "num_new_tokens": new}
        if computed == 0:
            op |= {"num_tokens": req.num_tokens, "full_sequence_must_fit": True}
        sc["ops"].append(op)
        if coordinator.allocate_slots(req, new, full_sequence_must_fit=computed == 0):
            req.num_computed_tokens += new
    return sc


HAND = [
    scenario(  # a prompt past the window by chunks, then decodes across block boundaries
        "one-request",
        [
            {
                "op": "allocate",
                "req": "a",
                "num_computed_tokens": 0,
                "num_new_tokens": 64,
                "num_tokens": 260,
                "full_sequence_must_fit": True,
            },
            *(
                {"op": "allocate", "req": "a", "num_computed_tokens": c, "num_new_tokens": 64}
                for c in (64, 128, 192)
            ),
            *(
                {"op": "allocate", "req": "a", "num_computed_tokens": c, "num_new_tokens": 1}
                for c in range(256, 260)
            ),
            {"op": "free", "req": "a"},
        ],
        block_size=16,
        window=128,
        num_blocks=40,
        budget=64,
    ),
    scenario(  # a refused step still frees what left the window (vLLM frees before it counts)
        "refused-after-freeing",
        [
            {
                "op": "allocate",
                "req": "a",
                "num_computed_tokens": 0,
                "num_new_tokens": 48,
                "num_tokens": 100,
                "full_sequence_must_fit": True,
            },
            {
                "op": "allocate",
                "req": "b",
                "num_computed_tokens": 0,
                "num_new_tokens": 48,
                "num_tokens": 150,
                "full_sequence_must_fit": True,
            },
            {"op": "allocate", "req": "a", "num_computed_tokens": 48, "num_new_tokens": 48},
            {"op": "allocate", "req": "b", "num_computed_tokens": 48, "num_new_tokens": 100},
            {"op": "allocate", "req": "b", "num_computed_tokens": 48, "num_new_tokens": 16},
            {"op": "free", "req": "a"},
            {"op": "allocate", "req": "b", "num_computed_tokens": 64, "num_new_tokens": 64},
            {"op": "free", "req": "b"},
        ],
        block_size=16,
        window=32,
        num_blocks=24,
        budget=64,
    ),
]
SCENARIOS = {sc["name"]: sc for sc in [*HAND, *(generated(seed) for seed in range(12))]}


@pytest.fixture(scope="module")
def vllm_records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every scenario through vLLM's KV cache manager, in one run of the peer script."""
    work = tmp_path_factory.mktemp("vllm-sliding-window")
    path = work / "scenarios.json"
    path.write_text(json.dumps(list(SCENARIOS.values())))
    out = json.loads(run_script("step_sliding_window.py", str(path)))
    return {name: records[1:] for name, records in zip(SCENARIOS, out, strict=True)}  # [0]: its config


def run_testbed(sc: dict[str, Any]) -> list[dict[str, Any]]:
    """The scenario's ops through the testbed's coordinator, in the peer script's record terms."""
    coordinator, sliding = coordinator_for(sc)
    requests: dict[str, Request] = {}
    records = []
    for op in sc["ops"]:
        rid = op["req"]
        if op["op"] == "free":
            coordinator.free(requests.pop(rid))
            records.append({"ok": True, "num_free_blocks": coordinator.num_free_blocks})
            continue
        if rid not in requests:
            num_tokens = op.get("num_tokens", op["num_computed_tokens"] + op["num_new_tokens"])
            requests[rid] = Request(EngineRequest(rid, list(range(num_tokens)), 1), 0.0)
        req = requests[rid]
        req.num_computed_tokens = op["num_computed_tokens"]
        ok = coordinator.allocate_slots(
            req, op["num_new_tokens"], full_sequence_must_fit=op.get("full_sequence_must_fit", False)
        )
        table = sliding.tables(req)
        records.append(
            {
                "ok": ok,
                "num_free_blocks": coordinator.num_free_blocks,
                "full": len(req.block_ids),
                "sliding_nulls": [slot is None for slot in table],
            }
        )
    for req in requests.values():
        coordinator.free(req)
    coordinator.assert_empty()
    return records


def as_testbed_terms(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in records:
        if r["op"] == "free":
            out.append({"ok": True, "num_free_blocks": r["num_free_blocks"]})
            continue
        full, sliding = r["block_tables"]
        out.append(
            {
                "ok": r["ok"],
                "num_free_blocks": r["num_free_blocks"],
                "full": len(full),
                "sliding_nulls": [block is None for block in sliding],
            }
        )
    return out


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_sliding_window_blocks_are_freed_as_vllm_frees_them(name, vllm_records):
    sc = SCENARIOS[name]
    theirs, ours = as_testbed_terms(vllm_records[name]), run_testbed(sc)
    for i, (a, b) in enumerate(zip(theirs, ours, strict=True)):
        assert b == a, f"{name}: op {i} {sc['ops'][i]}: vLLM {a}, testbed {b}"


def test_the_scenarios_free_blocks_and_refuse(vllm_records):
    """The comparison has teeth: blocks leave windows, a table reaches vLLM's admission cap, and steps
    are refused."""
    records = [r for name in SCENARIOS for r in vllm_records[name] if r["op"] == "allocate"]
    assert sum(None in r["block_tables"][1] for r in records) > 20
    assert sum(not r["ok"] for r in records) >= 3
    cap = max_window_blocks(128, 16, 64)  # "one-request"'s: its window's blocks never pass it
    held = [
        sum(b is not None for b in r["block_tables"][1])
        for r in vllm_records["one-request"]
        if r["op"] == "allocate"
    ]
    assert max(held) <= cap and max(held) >= cap - 2
