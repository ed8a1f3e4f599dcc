"""Step vLLM's whole engine, in process, on the testbed's tiny Qwen2 runner model, through scenarios.

Runs with the vLLM peer's python (`tests/vllm_peer.py`); imports only vLLM, torch and the standard
library (and `step_scheduler.py` beside it, for the record's shape).

    python step_engine.py MODEL_DIR SCENARIOS.json  ->  stdout: JSON, one result per scenario

MODEL_DIR holds the runner's weights (`save_pretrained`; 2 query heads, 1 KV head: head_dim 32, which
vLLM's CPU attention serves). Nothing is downloaded, no tokenizer is loaded: prompts are token IDs.
Each scenario builds its own `LLM` (`VLLM_ENABLE_V1_MULTIPROCESSING=0`: the engine core in this
process; eager, float32, `block_size` 32, exactly `num_gpu_blocks` blocks, its null block among
them). A scenario is `step_scheduler.py`'s, less the aborts::

    {"block_size": 32, "num_gpu_blocks": 12, "max_num_batched_tokens": 64, "max_num_seqs": 4,
     "max_model_len": 352, "enable_prefix_caching": true, "reserve_full_isl": true,
     "requests": [{"id": "r0", "prompt_token_ids": [...], "max_tokens": 5, "arrival_step": 0}, ...],
     "max_steps": 2000}

Each step k: requests whose `arrival_step` is k are added (in list order; greedy, `ignore_eos`, the top
two logprobs of every sampled position asked for), then `llm_engine.step()` runs. The engine core's
`Scheduler.schedule` is wrapped to keep the step's `SchedulerOutput`; a step that schedules and
preempts nothing (the engine idle) records nothing. Steps run until every request has arrived and
finished. Output::

    {"records": [step_scheduler.py's record, one per step that scheduled or preempted: scheduled, preempted,
                 finished, free_blocks, admitted],
     "outputs": {id: {"token_ids": [...], "token_steps": [the step that emitted each token],
                      "num_cached_tokens": n, "top2": [[token, logprob, token, logprob] per token]}}}
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
from typing import Any

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the scenario's block count is what is used
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from step_scheduler import admitted_this_step, check_config, spy_on_preemptions
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.outputs import RequestOutput
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler

NUM_LOGPROBS = 2
"""Top logprobs kept per sampled token: the margin between the first two is how near a tie it was."""


def build_llm(model_dir: str, sc: dict[str, Any]) -> LLM:
    """vLLM's engine over exactly `num_gpu_blocks` blocks, configured as the scenario says (checked)."""
    llm = LLM(
        model=model_dir,
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="float32",
        seed=0,
        block_size=sc["block_size"],
        num_gpu_blocks_override=sc["num_gpu_blocks"],
        max_num_batched_tokens=sc["max_num_batched_tokens"],
        max_num_seqs=sc["max_num_seqs"],
        max_model_len=sc["max_model_len"],
        enable_prefix_caching=sc["enable_prefix_caching"],
        scheduler_reserve_full_isl=sc["reserve_full_isl"],
    )
    check_config(scheduler_of(llm), sc)
    return llm


def scheduler_of(llm: LLM) -> Scheduler:
    """The engine core's scheduler (in process: `InprocClient.engine_core`)."""
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler  # type: ignore[attr-defined]
    assert type(scheduler) is Scheduler, f"not vLLM's synchronous Scheduler: {type(scheduler)}"
    return scheduler


def capture_schedules(scheduler: Scheduler) -> list[SchedulerOutput]:
    """A list that collects every `SchedulerOutput` the engine core's scheduler returns."""
    outputs: list[SchedulerOutput] = []
    schedule = scheduler.schedule

    def capture(*args: Any, **kwargs: Any) -> SchedulerOutput:
        out = schedule(*args, **kwargs)
        outputs.append(out)
        return out

    scheduler.schedule = capture  # type: ignore[method-assign]
    return outputs


def params(spec: dict[str, Any]) -> SamplingParams:
    return SamplingParams(
        temperature=0.0,
        max_tokens=spec["max_tokens"],
        ignore_eos=True,
        detokenize=False,
        logprobs=NUM_LOGPROBS,
    )


def run(model_dir: str, sc: dict[str, Any]) -> dict[str, Any]:
    """Step one scenario's engine to the end; its records and each request's outputs."""
    llm = build_llm(model_dir, sc)
    engine, scheduler = llm.llm_engine, scheduler_of(llm)
    schedules = capture_schedules(scheduler)
    preempted = spy_on_preemptions(scheduler)
    external: dict[str, str] = {}  # the engine's request id (a random suffix added) -> the scenario's
    requests = sc["requests"]
    last_arrival = max(r["arrival_step"] for r in requests)
    records: list[dict[str, Any]] = []
    finals: dict[str, RequestOutput] = {}  # each request's latest (cumulative) output
    token_steps: dict[str, list[int]] = {r["id"]: [] for r in requests}
    for step in range(sc["max_steps"]):
        for spec in requests:
            if spec["arrival_step"] == step:
                prompt = TokensPrompt(prompt_token_ids=list(spec["prompt_token_ids"]))
                external[engine.add_request(spec["id"], prompt, params(spec))] = spec["id"]
        schedules.clear()
        preempted.clear()
        outs = [o for o in engine.step() if isinstance(o, RequestOutput)]
        for o in outs:
            new = len(o.outputs[0].token_ids) - len(token_steps[o.request_id])  # cumulative outputs
            token_steps[o.request_id] += [step] * new
            finals[o.request_id] = o
        if schedules and (schedules[0].num_scheduled_tokens or preempted):
            (out,) = schedules
            records.append(record(step, out, preempted, [o for o in outs if o.finished], scheduler, external))
        if step >= last_arrival and not engine.has_unfinished_requests():
            break
    result = {
        "records": records,
        "outputs": {rid: output(finals[rid], token_steps[rid]) for rid in token_steps},
    }
    del llm, engine, scheduler
    gc.collect()
    return result


def record(
    step: int,
    out: SchedulerOutput,
    preempted: list[str],
    finished: list[RequestOutput],
    scheduler: Scheduler,
    external: dict[str, str],
) -> dict[str, Any]:
    """`step_scheduler.py`'s record of one step, in the scenario's request ids."""
    assert set(preempted) == set(out.preempted_req_ids or ()), (preempted, out.preempted_req_ids)
    return {
        "step": step,
        "scheduled": {external[r]: n for r, n in out.num_scheduled_tokens.items()},
        "preempted": [external[r] for r in preempted],
        "finished": sorted(o.request_id for o in finished),
        "free_blocks": scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
        "admitted": {external[r]: n for r, n in admitted_this_step(out).items()},
    }


def output(final: RequestOutput, token_steps: list[int]) -> dict[str, Any]:
    """A request's greedy tokens, the step of each, its prefix hit, and the top two logprobs of each
    sampled position (token, logprob, token, logprob)."""
    completion = final.outputs[0]
    assert final.finished and completion.logprobs is not None
    top2 = []
    for position in completion.logprobs:
        ranked = sorted(position.items(), key=lambda kv: kv[1].rank or 0)
        (t1, l1), (t2, l2) = [(t, lp) for t, lp in ranked if lp.rank in (1, 2)]
        top2.append([t1, l1.logprob, t2, l2.logprob])
    return {
        "token_ids": list(completion.token_ids),
        "token_steps": token_steps,
        "num_cached_tokens": final.num_cached_tokens or 0,
        "top2": top2,
    }


def main() -> None:
    model_dir, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        scenarios = json.load(f)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the JSON only
        results = [run(model_dir, sc) for sc in scenarios]
    json.dump(results, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
