"""Step vLLM's own sliding-window KV cache management (prefix caching off) through allocate/free ops.

Runs with the vLLM peer's python (`tests/vllm_peer.py`); imports only vLLM and the standard library.

    python step_sliding_window.py SCENARIOS.json  ->  stdout: JSON records

It builds vLLM's real `KVCacheManager` (`enable_caching=False`, so vLLM's own
`get_kv_cache_coordinator` picks `KVCacheCoordinatorNoPrefixCache`, one or two groups alike) and calls
its `allocate_slots` and `free` with a light request object. The real manager is used rather than
re-sequencing the coordinator/manager calls here: with prefix caching off, `allocate_slots` only reads
the request's id, status, computed, prompt, total and in-flight token counts (no block hashes), so the
light object is faithful, and vLLM's own call order is what runs: (full-sequence admission gate,)
`remove_skipped_blocks`, `get_num_blocks_to_allocate`, the free-block check, `allocate_new_blocks`.

A scenario::

    {"block_size": 16, "sliding_window": 100, "num_blocks": 12,   # vLLM's count: its null block included
     "groups": ["sliding"] or ["full", "sliding"],                # one KV cache group each, in this order
     "max_num_batched_tokens": 2048, "max_model_len": 8192,       # optional (these defaults), for the
     "async_scheduling": false,                                   #   admission cap only
     "ops": [{"op": "allocate", "req": "a", "num_computed_tokens": 0, "num_new_tokens": 64,
              # optional: the request's tokens (prompt and output so far; default computed + new),
              # its lookahead (spec decode) tokens, and the scheduler's admission gate for a waiting
              # request (`scheduler_reserve_full_isl`, on by default in vLLM: scheduler.py:1270)
              "num_tokens": 300, "num_lookahead_tokens": 0, "full_sequence_must_fit": false},
             {"op": "free", "req": "a"}, ...]}

A request's first allocate is taken as its admission (status WAITING), later ones as RUNNING. Without
prefix caching or a connector vLLM admits a request with `num_computed_tokens` 0 (a preempted one is
reset to 0), so a first allocate with more is refused: vLLM would count the blocks below the window as
skipped (single_type_kv_cache_manager.py:245) yet allocate them all (:401), as no null padding was
added (`allocate_new_computed_blocks` is not called without computed blocks).

The output is one list per scenario: first a config record, then one record per op::

    {"op": "config", "admission_cap": [per group: blocks, or null where vLLM sets none],
     "max_in_flight_tokens": n, "max_model_len": n, "num_free_blocks": n (the null block excluded)}
    {"op": "allocate" | "free", "req": id,
     "ok": bool,                       # allocate_slots returned blocks (free: always true)
     "num_free_blocks": n,             # the pool's free blocks after the op
     "block_tables": [[ids], ...],     # per group, the request's blocks after the op; null where vLLM
                                       # holds its null block (a block that left the window)
     "num_skipped_tokens": [n, ...],   # per group, get_num_skipped_tokens(num_computed_tokens): what
                                       # this op's remove_skipped_blocks used (not run when the
                                       # full-sequence gate refused; free: null)
     "num_blocks_to_allocate": [n]}    # what get_num_blocks_to_allocate returned, in call order (two
                                       # values when the admission gate ran and passed; free: [])

A failed allocate is not always a no-op in vLLM: `remove_skipped_blocks` runs before the free-block
check (kv_cache_manager.py:555 before :577), so blocks that left the window are freed even when the
allocation then fails. Only a failure of the full-sequence gate (:538) changes nothing.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch
from vllm.utils.math_utils import cdiv
from vllm.v1.core.kv_cache_coordinator import KVCacheCoordinatorNoPrefixCache
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager, SlidingWindowManager
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.request import RequestStatus

MANAGERS = {"full": FullAttentionManager, "sliding": SlidingWindowManager}


@dataclass
class LightRequest:
    """What `KVCacheManager.allocate_slots` and `free` read from a `Request` with prefix caching off."""

    request_id: str
    num_computed_tokens: int
    num_tokens: int
    num_prompt_tokens: int
    status: RequestStatus
    # Tokens scheduled but not yet processed: 0 for a synchronous scheduler at schedule time.
    num_in_flight_tokens: int = 0


def build_manager(sc: dict[str, Any]) -> KVCacheManager:
    """vLLM's `KVCacheManager` over `num_blocks` blocks (its null block among them) shared by the
    scenario's groups, all of `block_size` tokens, as the scheduler builds it (scheduler.py:327)."""
    bs, window = sc["block_size"], sc["sliding_window"]
    specs = {
        "full": FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32),
        "sliding": SlidingWindowSpec(
            block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=window
        ),
    }
    groups = [KVCacheGroupSpec([f"{kind}.{i}"], specs[kind]) for i, kind in enumerate(sc["groups"])]
    config = KVCacheConfig(num_blocks=sc["num_blocks"], kv_cache_tensors=[], kv_cache_groups=groups)
    manager = KVCacheManager(
        kv_cache_config=config,
        max_model_len=sc.get("max_model_len", 8192),
        scheduler_block_size=bs,
        hash_block_size=bs,
        max_in_flight_tokens=max_in_flight_tokens(sc),
        enable_caching=False,
    )
    got = (type(manager.coordinator), [type(m) for m in manager.coordinator.single_type_managers])
    want = (KVCacheCoordinatorNoPrefixCache, [MANAGERS[kind] for kind in sc["groups"]])
    if got != want:
        raise SystemExit(f"vLLM built the scenario's KV cache differently (want, got): {want}, {got}")
    return manager


def max_in_flight_tokens(sc: dict[str, Any]) -> int:
    """`VllmConfig.max_in_flight_tokens` (config/vllm.py:590): max_concurrent_batches x
    max_num_batched_tokens, where max_concurrent_batches (:577) is 2 with async scheduling, else 1
    (no pipeline parallelism)."""
    return (2 if sc.get("async_scheduling", False) else 1) * sc.get("max_num_batched_tokens", 2048)


def admission_cap(manager: KVCacheManager) -> list[int | None]:
    """Per group, the per-request block cap vLLM's full-sequence admission gate applies
    (`apply_admission_cap`, single_type_kv_cache_manager.py:214), read from the managers vLLM built.

    For a sliding-window group it is `SlidingWindowSpec.max_admission_blocks_per_request`
    (kv_cache_interface.py:859, set on the manager at single_type_kv_cache_manager.py:2623):
        cdiv(min(sliding_window - 1 + extra_retained_tokens + max_in_flight_tokens, max_model_len),
             block_size) + 1
    (+1: the window need not start on a block boundary). Full attention has none (null)."""
    return [m.max_admission_blocks_per_request for m in manager.coordinator.single_type_managers]


def run(sc: dict[str, Any]) -> list[dict[str, Any]]:
    """The scenario's config record, then one record per op."""
    manager = build_manager(sc)
    coordinator = manager.coordinator
    caps = admission_cap(manager)
    for m, cap in zip(coordinator.single_type_managers, caps, strict=True):
        if isinstance(m, SlidingWindowManager):  # the formula above, checked against vLLM's value
            spec = m.kv_cache_spec
            tokens = spec.sliding_window - 1 + spec.extra_retained_tokens + max_in_flight_tokens(sc)
            assert cap == cdiv(min(tokens, manager.max_model_len), spec.block_size) + 1, cap
    records: list[dict[str, Any]] = [
        {
            "op": "config",
            "admission_cap": caps,
            "max_in_flight_tokens": max_in_flight_tokens(sc),
            "max_model_len": manager.max_model_len,
            "num_free_blocks": manager.block_pool.get_num_free_blocks(),
        }
    ]

    # Spy on the coordinator's block count (not a change: the real method runs and its value is kept).
    counted: list[int] = []
    count_blocks = coordinator.get_num_blocks_to_allocate

    def counting(*args: Any, **kwargs: Any) -> int:
        n = count_blocks(*args, **kwargs)
        counted.append(n)
        return n

    coordinator.get_num_blocks_to_allocate = counting  # type: ignore[method-assign]

    known: set[str] = set()  # requests allocated at least once since their last free
    for op in sc["ops"]:
        rid = op["req"]
        counted.clear()
        if op["op"] == "allocate":
            computed, new = op["num_computed_tokens"], op["num_new_tokens"]
            num_tokens = op.get("num_tokens", computed + new)
            if rid not in known and computed:
                raise SystemExit(f"a request's first allocate must have num_computed_tokens 0: {op!r}")
            request = LightRequest(
                request_id=rid,
                num_computed_tokens=computed,
                num_tokens=num_tokens,
                num_prompt_tokens=num_tokens,
                status=RequestStatus.RUNNING if rid in known else RequestStatus.WAITING,
            )
            ok = (
                manager.allocate_slots(
                    request,
                    new,
                    num_lookahead_tokens=op.get("num_lookahead_tokens", 0),
                    full_sequence_must_fit=op.get("full_sequence_must_fit", False),
                )
                is not None
            )
            if ok:  # a refused admission leaves the request waiting, holding nothing
                known.add(rid)
            skipped = [m.get_num_skipped_tokens(computed) for m in coordinator.single_type_managers]
        elif op["op"] == "free":
            manager.free(LightRequest(rid, 0, 0, 0, RequestStatus.FINISHED_ABORTED))
            known.discard(rid)
            ok, skipped = True, None
        else:
            raise SystemExit(f"unknown op: {op!r}")
        tables = [
            [None if b.is_null else b.block_id for b in m.req_to_blocks.get(rid, ())]
            for m in coordinator.single_type_managers
        ]
        records.append(
            {
                "op": op["op"],
                "req": rid,
                "ok": ok,
                "num_free_blocks": manager.block_pool.get_num_free_blocks(),
                "block_tables": tables,
                "num_skipped_tokens": skipped,
                "num_blocks_to_allocate": list(counted),
            }
        )
    return records


def main() -> None:
    """SCENARIOS.json (one scenario or a list): each scenario's records, as JSON on stdout."""
    with open(sys.argv[1]) as f:
        scenarios = json.load(f)
    if isinstance(scenarios, dict):
        json.dump(run(scenarios), sys.stdout)
    else:
        json.dump([run(sc) for sc in scenarios], sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
