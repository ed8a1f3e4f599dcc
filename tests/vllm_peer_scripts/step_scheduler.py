"""Step vLLM's own v1 `Scheduler` alone (no model, no workers) through conformance scenarios.

Runs with the vLLM peer's python (`tests/vllm_peer.py`); imports only vLLM and the standard library.

    python step_scheduler.py MODEL_DIR SCENARIOS.json  ->  stdout: JSON records

MODEL_DIR holds a Hugging Face `config.json` (the testbed's tiny Qwen2): vLLM needs a model config to
build a `VllmConfig`, and nothing is downloaded (`HF_HUB_OFFLINE`, no tokenizer). SCENARIOS.json holds
one scenario or a list of them; the output is one record list per scenario, in the same shape.

A scenario::

    {"block_size": 16, "num_gpu_blocks": 24,        # vLLM's count: its null block included
     "max_num_batched_tokens": 64, "max_num_seqs": 4, "max_model_len": 2048,
     "enable_prefix_caching": true, "reserve_full_isl": true,
     "requests": [{"id": "r0", "prompt_token_ids": [...], "max_tokens": 5, "arrival_step": 0}, ...],
     "aborts": [{"id": "r0", "step": 3}], "max_steps": 2000}

Each step k: requests whose `arrival_step` is k are added (in list order), aborts of step k are applied
(`finish_requests(..., FINISHED_ABORTED)`; one already finished is a no-op), `schedule()` runs, and a
made-up `ModelRunnerOutput` samples `TOKEN` (not EOS; `ignore_eos`) for every scheduled request whose
computed tokens caught up with its tokens. Steps run until every request has arrived and finished.

One record per step::

    {"step": k, "scheduled": {id: num_scheduled_tokens}, "preempted": [ids, in preemption order],
     "finished": [ids, sorted: aborted or stopped this step], "free_blocks": n (after the step),
     "admitted": {id: num_computed_tokens before the step, for each request moved from waiting to
                  running this step (new, or resumed after a preemption): its prefix-cache hit}}
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

TOKEN = 7
"""The token every caught-up request samples (the tiny model's vocabulary has it; it is no stop token)."""


def scheduler_vllm_config(model_dir: str, sc: dict[str, Any]) -> VllmConfig:
    """The engine config a scenario's scheduler runs under: its budget, sequences, model length, block
    size and prefix caching, synchronous, chunked prefill on; `num_gpu_blocks` exactly."""
    model_config = ModelConfig(
        model=model_dir,
        tokenizer=model_dir,
        skip_tokenizer_init=True,
        dtype="float32",
        seed=0,
        max_model_len=sc["max_model_len"],
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=sc["max_num_seqs"],
        max_num_batched_tokens=sc["max_num_batched_tokens"],
        max_model_len=sc["max_model_len"],
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        async_scheduling=False,
        scheduler_reserve_full_isl=sc["reserve_full_isl"],
    )
    cache_config = CacheConfig(
        block_size=sc["block_size"],
        enable_prefix_caching=sc["enable_prefix_caching"],
    )
    vllm_config = VllmConfig(
        model_config=model_config, scheduler_config=scheduler_config, cache_config=cache_config
    )
    vllm_config.cache_config.num_gpu_blocks = sc["num_gpu_blocks"]
    return vllm_config


def build_scheduler(model_dir: str, sc: dict[str, Any]) -> Scheduler:
    """vLLM's synchronous `Scheduler` over exactly `num_gpu_blocks` blocks (its null block among them),
    configured as vLLM's own unit tests build one (`tests/v1/core/utils.py:create_scheduler`)."""
    vllm_config = scheduler_vllm_config(model_dir, sc)
    spec = FullAttentionSpec(block_size=sc["block_size"], num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(
        num_blocks=sc["num_gpu_blocks"],
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    scheduler = Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=sc["block_size"],
        log_stats=False,
    )
    check_config(scheduler, sc)
    return scheduler


def check_config(scheduler: Scheduler, sc: dict[str, Any]) -> None:
    """Fail loudly if vLLM's config resolution changed what the scenario asked for."""
    s, c = scheduler.scheduler_config, scheduler.cache_config
    got = {
        "block_size": scheduler.block_size,
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "max_num_scheduled_tokens": scheduler.max_num_scheduled_tokens,
        "max_num_seqs": s.max_num_seqs,
        "enable_prefix_caching": c.enable_prefix_caching,
        "reserve_full_isl": scheduler.scheduler_reserve_full_isl,
        "enable_chunked_prefill": s.enable_chunked_prefill,
        "async_scheduling": bool(s.async_scheduling),
        "long_prefill_token_threshold": s.long_prefill_token_threshold,
        "watermark": s.watermark,
        "free_blocks": scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
    }
    want = {
        "block_size": sc["block_size"],
        "max_num_batched_tokens": sc["max_num_batched_tokens"],
        "max_num_scheduled_tokens": sc["max_num_batched_tokens"],
        "max_num_seqs": sc["max_num_seqs"],
        "enable_prefix_caching": sc["enable_prefix_caching"],
        "reserve_full_isl": sc["reserve_full_isl"],
        "enable_chunked_prefill": True,
        "async_scheduling": False,
        "long_prefill_token_threshold": 0,
        "watermark": 0.0,
        "free_blocks": sc["num_gpu_blocks"] - 1,  # the null block is never free
    }
    if got != want:
        diff = {k: (want[k], got[k]) for k in want if got[k] != want[k]}
        raise SystemExit(f"vLLM resolved the scenario's config differently (want, got): {diff}")


def make_request(spec: dict[str, Any], block_hasher: Any) -> Request:
    params = SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True, temperature=0.0)
    return Request(
        request_id=spec["id"],
        prompt_token_ids=list(spec["prompt_token_ids"]),
        sampling_params=params,
        pooling_params=None,
        arrival_time=float(spec["arrival_step"]),
        block_hasher=block_hasher,
    )


def run(model_dir: str, sc: dict[str, Any]) -> list[dict[str, Any]]:
    """Step one scenario to the end; returns its per-step records."""
    scheduler = build_scheduler(model_dir, sc)
    block_hasher = None
    if sc["enable_prefix_caching"]:
        hash_fn = get_hash_fn_by_name(scheduler.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        block_hasher = get_request_block_hasher(sc["block_size"], hash_fn)
    requests = sc["requests"]
    aborts = sc.get("aborts", [])
    last_arrival = max(r["arrival_step"] for r in requests)
    preempted = spy_on_preemptions(scheduler)
    records = []
    for step in range(sc.get("max_steps", 2000)):
        for spec in requests:
            if spec["arrival_step"] == step:
                scheduler.add_request(make_request(spec, block_hasher))
        ids = [a["id"] for a in aborts if a["step"] == step]
        aborted = [r.request_id for r in scheduler.finish_requests(ids, RequestStatus.FINISHED_ABORTED)]
        preempted.clear()
        out = scheduler.schedule()
        engine_outputs = scheduler.update_from_output(out, made_up_output(scheduler, out))
        outputs = [o for eco in engine_outputs.values() for o in eco.outputs]
        stopped = [o.request_id for o in outputs if o.finish_reason is not None]
        assert set(preempted) == set(out.preempted_req_ids or ()), (preempted, out.preempted_req_ids)
        records.append(
            {
                "step": step,
                "scheduled": dict(out.num_scheduled_tokens),
                "preempted": list(preempted),
                "finished": sorted(aborted + stopped),
                "free_blocks": scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
                "admitted": admitted_this_step(out),
            }
        )
        if step >= last_arrival and not scheduler.has_unfinished_requests():
            break
    return records


def made_up_output(scheduler: Scheduler, out: SchedulerOutput) -> ModelRunnerOutput:
    """What a model would return for `out`: `TOKEN` for each request whose computed tokens caught up
    with its tokens (`schedule` has advanced them already), nothing for a prefill chunk short of it."""
    req_ids = list(out.num_scheduled_tokens)
    sampled = []
    for req_id in req_ids:
        req = scheduler.requests[req_id]
        sampled.append([TOKEN] if req.num_computed_tokens >= req.num_tokens else [])
    return ModelRunnerOutput(
        req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)}, sampled_token_ids=sampled
    )


def admitted_this_step(out: SchedulerOutput) -> dict[str, int]:
    """The requests moved from waiting to running by this step (new, or resumed after a preemption),
    each with its computed tokens before the step: its prefix-cache hit."""
    admitted = {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    for req_id, num_computed in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
        if req_id in cached.resumed_req_ids:
            admitted[req_id] = num_computed
    return admitted


def spy_on_preemptions(scheduler: Scheduler) -> list[str]:
    """A list that collects the ids `scheduler` preempts, in order (`SchedulerOutput` has them as a set)."""
    order: list[str] = []
    preempt = scheduler._preempt_request

    def spy(request: Request, *args: Any, **kwargs: Any) -> None:
        order.append(request.request_id)
        preempt(request, *args, **kwargs)

    scheduler._preempt_request = spy
    return order


def main(run_one: Callable[[str, dict[str, Any]], list[dict[str, Any]]] = run) -> None:
    """MODEL_DIR SCENARIOS.json: each scenario's records (`run_one`), as JSON on stdout."""
    model_dir, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        scenarios = json.load(f)
    if isinstance(scenarios, dict):
        json.dump(run_one(model_dir, scenarios), sys.stdout)
    else:
        json.dump([run_one(model_dir, sc) for sc in scenarios], sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
