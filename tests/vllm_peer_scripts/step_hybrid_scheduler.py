"""Step vLLM's own v1 `Scheduler` alone for a hybrid (attention + Mamba) KV cache: one full-attention
group and G Mamba groups in align mode (prefix caching on), no model, no workers.

Runs with the vLLM peer's python (`tests/vllm_peer.py`); imports only vLLM, the standard library and
`step_scheduler.py` beside it (its step loop, requests, made-up outputs and records are reused).

    python step_hybrid_scheduler.py MODEL_DIR SCENARIOS.json  ->  stdout: JSON records

A scenario is `step_scheduler.py`'s, plus::

    {"num_state_groups": 4,           # Mamba groups beside the one full-attention group
     "internal_checkpoint": false}    # the Mamba spec exports its prefill checkpoint from inside a
                                      # step (Mamba2: num_prefill_checkpoint_blocks=1, alignment 1)

The KV cache config is what vLLM's engine core resolves for such a model with prefix caching on:
`mamba_cache_mode="align"` (`MambaModelConfig.verify_and_update_config`), the Mamba block size equal
to the attention block size, and `prefix_cache_retention_interval` from `CacheConfig` (default 0:
Mamba states kept only at a prompt's replay boundary and at a shared-prefix junction). One record per
step, as `step_scheduler.py`'s, plus::

    "junction": {id: position}   # admitted this step with a shared-prefix junction (an attention hit
                                 # longer than the Mamba hit: request.shared_prefix_boundary)
    "deferred": [ids]            # refused this step: their Mamba hit is a state cached this step
    "state_blocks": n            # after the step, the distinct blocks the Mamba groups hold
    "state_holders": n           # and the requests holding any
"""

from __future__ import annotations

from typing import Any

import step_scheduler  # beside this script: sets vLLM's environment before importing it
import torch
from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager, MambaManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec


def build_scheduler(model_dir: str, sc: dict[str, Any]) -> Scheduler:
    """vLLM's synchronous `Scheduler` over `num_gpu_blocks` blocks (its null block among them) shared by
    one full-attention group and `num_state_groups` Mamba groups, all of `block_size` tokens."""
    bs = sc["block_size"]
    vllm_config = step_scheduler.scheduler_vllm_config(model_dir, sc)
    # What `MambaModelConfig.verify_and_update_config` sets for a hybrid model with prefix caching
    # (the tiny config is not a hybrid one, so it is set here).
    vllm_config.cache_config.mamba_cache_mode = "align"
    vllm_config.cache_config.mamba_block_size = bs
    internal = sc["internal_checkpoint"]
    attention = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32)
    mamba = MambaSpec(
        block_size=bs,
        shapes=((1,),),
        dtypes=(torch.float32,),
        mamba_cache_mode="align",
        num_prefill_checkpoint_blocks=1 if internal else 0,
        prefill_checkpoint_alignment=1 if internal else None,
    )
    groups = [KVCacheGroupSpec(["attn"], attention)]
    groups += [KVCacheGroupSpec([f"mamba.{g}"], mamba) for g in range(sc["num_state_groups"])]
    kv_cache_config = KVCacheConfig(
        num_blocks=sc["num_gpu_blocks"],
        kv_cache_tensors=[],
        kv_cache_groups=groups,
        prefix_cache_retention_interval=vllm_config.cache_config.prefix_cache_retention_interval,
    )
    scheduler = Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=step_scheduler.StructuredOutputManager(vllm_config),
        block_size=bs,
        log_stats=False,
    )
    check_config(scheduler, sc)
    return scheduler


def check_config(scheduler: Scheduler, sc: dict[str, Any]) -> None:
    """Fail loudly if vLLM resolved the scenario's hybrid config differently."""
    coordinator = scheduler.kv_cache_manager.coordinator
    managers = coordinator.single_type_managers
    got = {
        "block_size": scheduler.block_size,
        "hash_block_size": scheduler.hash_block_size,
        "max_num_scheduled_tokens": scheduler.max_num_scheduled_tokens,
        "long_prefill_token_threshold": scheduler.scheduler_config.long_prefill_token_threshold,
        "watermark": scheduler.scheduler_config.watermark,
        "reserve_full_isl": scheduler.scheduler_reserve_full_isl,
        "coordinator": type(coordinator).__name__,
        "managers": [type(m).__name__ for m in managers],
        "mamba_cache_mode": scheduler.cache_config.mamba_cache_mode,
        "aligned_split": scheduler.need_mamba_block_aligned_split,
        "internal_checkpoint": scheduler.mamba_has_prefill_checkpoint_blocks,
        "partial_hash_hits": coordinator.enable_partial_hash_hits,
        "retention_interval": coordinator.retention_interval,
        "free_blocks": scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
    }
    want = {
        "block_size": sc["block_size"],
        "hash_block_size": sc["block_size"],
        "max_num_scheduled_tokens": sc["max_num_batched_tokens"],
        "long_prefill_token_threshold": 0,
        "watermark": 0.0,
        "reserve_full_isl": sc["reserve_full_isl"],
        "coordinator": HybridKVCacheCoordinator.__name__,
        "managers": [FullAttentionManager.__name__] + [MambaManager.__name__] * sc["num_state_groups"],
        "mamba_cache_mode": "align",
        "aligned_split": True,
        "internal_checkpoint": sc["internal_checkpoint"],
        "partial_hash_hits": False,
        "retention_interval": 0,
        "free_blocks": sc["num_gpu_blocks"] - 1,
    }
    if got != want:
        diff = {k: (want[k], got[k]) for k in want if got[k] != want[k]}
        raise SystemExit(f"vLLM resolved the hybrid scenario's config differently (want, got): {diff}")


def state_blocks(scheduler: Scheduler) -> tuple[int, int]:
    """The distinct blocks the Mamba groups' block tables hold (null blocks aside), and the requests
    holding any."""
    held: set[int] = set()
    holders: set[str] = set()
    for manager in scheduler.kv_cache_manager.coordinator.single_type_managers:
        if isinstance(manager, MambaManager):
            for req_id, blocks in manager.req_to_blocks.items():
                ids = {b.block_id for b in blocks if not b.is_null}
                held |= ids
                if ids:
                    holders.add(req_id)
    return len(held), len(holders)


def run(model_dir: str, sc: dict[str, Any]) -> list[dict[str, Any]]:
    """`step_scheduler.run` over the hybrid scheduler, its records with the fields above."""
    built: list[Scheduler] = []
    extra: list[dict[str, Any]] = []
    junctions: dict[str, int] = {}
    deferred: set[str] = set()
    admitted_this_step = step_scheduler.admitted_this_step
    schedule = Scheduler.schedule
    blocks_to_allocate = MambaManager.get_num_blocks_to_allocate
    build_scheduler_dense = step_scheduler.build_scheduler

    def build(model_dir: str, sc: dict[str, Any]) -> Scheduler:
        built.append(build_scheduler(model_dir, sc))
        return built[-1]

    def schedule_noting_junctions(self: Scheduler) -> SchedulerOutput:
        out = schedule(self)
        for new in out.scheduled_new_reqs:  # a request may finish in its first step: noted now
            if at := self.requests[new.req_id].shared_prefix_boundary:
                junctions[new.req_id] = at
        return out

    def blocks_to_allocate_noting_deferrals(
        self: MambaManager, request_id: str, *args: Any, **kwargs: Any
    ) -> int:
        n = blocks_to_allocate(self, request_id, *args, **kwargs)
        if n > self.block_pool.num_gpu_blocks:  # "Mamba can't rely on blocks generated ... this step"
            deferred.add(request_id)
        return int(n)

    def admitted_and_more(out: SchedulerOutput) -> dict[str, int]:
        """Called once a step, after `update_from_output` (the record's `admitted`)."""
        admitted = admitted_this_step(out)
        held, holders = state_blocks(built[-1])
        extra.append(
            {
                "junction": {rid: at for rid, at in junctions.items() if rid in admitted},
                "deferred": sorted(deferred),
                "state_blocks": held,
                "state_holders": holders,
            }
        )
        junctions.clear()
        deferred.clear()
        return admitted

    step_scheduler.build_scheduler = build
    step_scheduler.admitted_this_step = admitted_and_more
    Scheduler.schedule = schedule_noting_junctions  # type: ignore[method-assign]
    MambaManager.get_num_blocks_to_allocate = blocks_to_allocate_noting_deferrals  # type: ignore[method-assign]
    try:
        records = step_scheduler.run(model_dir, sc)
    finally:
        step_scheduler.build_scheduler = build_scheduler_dense
        Scheduler.schedule = schedule  # type: ignore[method-assign]
        MambaManager.get_num_blocks_to_allocate = blocks_to_allocate  # type: ignore[method-assign]
        step_scheduler.admitted_this_step = admitted_this_step
    for record, more in zip(records, extra, strict=True):
        record.update(more)
    return records


if __name__ == "__main__":
    step_scheduler.main(run)
