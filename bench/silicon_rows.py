"""A silicon measurement (a row of aiconfigurator-core's `systems/silicon_sample.csv`) as the deployment
it describes: a raw testbed config, or the reason the testbed cannot express it.

Columns read (the CSV's names): `model_path`, `system` (a GPU name), `backend`, `mode` (agg or disagg),
`isl`, `osl`, `gemm_quant_mode` and `moe_quant_mode` (the weights' and the experts' formats), the
concurrency (`silicon_concurrency=` in `silicon_data_source`, else `batch_size`), an optional
`request_rate` (Poisson arrivals instead), and the parallelism of one worker::

    agg:      tp_size, pp_size, attention_dp_size, moe_tp_size, moe_ep_size        (one worker)
    disagg:   prefill_/decode_ num_workers, tp_size, pp_size, attention_dp_size, moe_tp_size, moe_ep_size

A worker's GPUs are tp_size x attention_dp_size (x pp_size). In the testbed a MoE replica is `ep` ranks
of `tp` GPUs: with attention DP, each rank one attention DP group (ep = attention_dp_size, tp =
tp_size; its experts sharded over the ranks and split tp ways inside each, where the worker may have
put them moe_ep_size ways: the same weight a GPU, another split); without, the experts' own layout (ep =
moe_ep_size, tp = moe_tp_size). A dense model's attention DP groups are engines of their own.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from emulation.hf_config import ModelConfigError
from emulation.profiles import GPUS, base_profile
from workloads.synthetic import length_bounds

MODEL_IDS = {
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
    "zhipuai/GLM-5": "zai-org/GLM-5",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1",
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",
}
"""Ids the CSV names whose config ships under another id with the same geometry (an Instruct model is
its base model's; the rows give the formats)."""
FORMATS = {"bfloat16": "bf16", "bf16": "bf16", "fp8": "fp8", "fp8_static": "fp8", "fp8_block": "fp8_block",
           "nvfp4": "nvfp4", "w4a16_mxfp4": "mxfp4", "mxfp4": "mxfp4", "int4_wo": "int4_wo"}  # fmt: skip
"""The CSV's quant modes as `target.quantization` formats."""
KV_LINKS = {"gb200": "nvlink", "gb300": "nvlink"}
"""A P/D handoff's link by system: inside an NVL72 rack, NVLink; elsewhere a 400 Gb/s RDMA NIC a GPU."""


@dataclass(frozen=True)
class Skipped:
    """A row the testbed cannot express, and why (counted by reason in the report)."""

    reason: str


def concurrency(row: dict[str, Any]) -> int | None:
    """Requests in flight: the benchmark's (`silicon_concurrency=` in the row's source), else
    `batch_size` (per attention-DP rank where the source gives the concurrency too)."""
    found = re.search(r"silicon_concurrency=(\d+)", str(row.get("silicon_data_source") or ""))
    if found:
        return int(found.group(1))
    return int(row["batch_size"]) if _number(row.get("batch_size")) else None


def from_inferencex(row: dict[str, Any]) -> bool:
    """Whether the row is a SemiAnalysis InferenceX result (a dated export or its database's dump)."""
    return re.match(r"source_file=20\d\d-|db-dump/", str(row.get("silicon_data_source") or "")) is not None


def deployment(row: dict[str, Any], num_requests: int) -> dict[str, Any] | Skipped:
    """The raw config (`cluster.config_load.build_config`'s input) of `row`'s deployment under
    `num_requests` requests, or why it cannot be built."""
    mode = row.get("mode")
    if mode not in ("agg", "disagg"):
        return Skipped(f"mode {mode!r}")
    rate = row.get("request_rate")
    closed = concurrency(row)
    if not _number(rate) and closed is None:
        return Skipped("no concurrency or request rate")
    weights, experts = (_format(row.get(f"{kind}_quant_mode")) for kind in ("gemm", "moe"))
    if weights is None or experts is None:
        return Skipped(f"quant mode {row.get('gemm_quant_mode')}/{row.get('moe_quant_mode')}")
    model = MODEL_IDS.get(str(row["model_path"]), str(row["model_path"]))
    try:
        moe = base_profile(model).moe is not None
    except ModelConfigError as e:
        return Skipped(f"model: {e}".split(";")[0])
    gpu = str(row["system"])
    if mode == "disagg" and not all(_number(row.get(f"{s}_num_workers")) for s in ("prefill", "decode")):
        return Skipped("disaggregated row without worker counts (its export lost them and attention DP)")
    sides = ("",) if mode == "agg" else ("prefill_", "decode_")
    pools: dict[str, Any] = {"mixed": {"replicas": 0}}
    for side in sides:
        pool = _pool(row, side, gpu, moe)
        if isinstance(pool, Skipped):
            return pool
        pools["mixed" if side == "" else side.rstrip("_")] = pool
    isl, osl = int(row["isl"]), int(row["osl"])
    workload: dict[str, Any] = {"kind": "synthetic", "prompt_len": isl, "output_len": osl,
                                "num_requests": num_requests}  # fmt: skip
    if from_inferencex(row):  # [0.8 L, L]: the nominal 0.9 L, +-1/9 of it in vLLM's sense of the ratio
        workload.update(prompt_len=round(0.9 * isl), output_len=round(0.9 * osl), random_range_ratio=1 / 9)
    if _number(rate):
        workload["rate"] = float(rate)
    else:
        assert closed is not None
        workload["max_concurrency"] = closed  # no warm-up: the bench weighs the first wave itself
    return {
        "design": str(row["id"]),
        "target": {
            "model": model,
            "quantization": {"weights": weights, "experts": experts, "kv_cache": kv_cache_of(row)},
            # Under `measured`: the row's engine's kernels; a GPU without them runs on the roofline.
            "kernel_tables": {"backend": str(row["backend"])},
            "measured_fallback": "roofline",
        },
        "pools": pools,
        "scheduler": {"max_model_len": _longest(workload, "prompt_len") + _longest(workload, "output_len")},
        "kv_transfer": {"link": KV_LINKS.get(gpu, "rdma-400g"), "mode": "pull"},
        "runner": {"compute": "skip"},
        "workload": workload,
    }


def _pool(row: dict[str, Any], side: str, gpu: str, moe: bool) -> dict[str, Any] | Skipped:
    """One side's workers as a pool (`side`: "" for an aggregated worker, else `prefill_`/`decode_`;
    `moe`: the model has routed experts). Sizes the CSV leaves empty or writes as 0 are 1; experts laid
    out over one GPU's worth (moe_tp x moe_ep = 1) of a larger worker are tensor-parallel over all of it
    (vLLM's default without --enable-expert-parallel)."""

    def get(name: str) -> int:
        value = row.get(side + name)
        return max(1, int(value)) if _number(value) else 1

    if get("pp_size") > 1:
        return Skipped("pipeline parallelism (pp_size > 1) is not modelled")
    tp, dp, workers = get("tp_size"), get("attention_dp_size"), get("num_workers") if side else 1
    if not moe:  # attention DP groups of a dense model are engines of their own
        return {"replicas": workers * dp, "gpu": gpu, "tp": tp}
    gpus = tp * dp
    if not side and gpu in GPUS and gpus > GPUS[gpu].gpus_per_node:
        return Skipped("an aggregated worker larger than a node (its export wrote tp x ep)")
    moe_tp, moe_ep = get("moe_tp_size"), get("moe_ep_size")
    if moe_tp * moe_ep == 1:
        moe_tp = gpus
    if moe_tp * moe_ep != gpus:
        return Skipped(
            "experts laid out over other GPUs than the worker's (moe_tp x moe_ep != tp x attention_dp)"
        )
    if dp > 1:
        return {"replicas": workers, "gpu": gpu, "ep": dp, "tp": tp, "dp_attention": True}
    return {"replicas": workers, "gpu": gpu, "ep": moe_ep, "tp": moe_tp}


FP8_KV_MODES = ("fp8", "fp8_static", "fp8_block", "nvfp4")
"""Weight quant modes whose rows ran with an FP8 KV cache: the rows carry no KV column, and
aiconfigurator-core, which collected them, sets its KV cache to FP8 for these modes when it builds a
row's deployment (its sdk/models/helpers.py). Its own rows are what this follows; vLLM's
`--kv-cache-dtype auto` would keep a plain FP8 checkpoint's KV in BF16. With BF16 KV, a MiniMax-M2.5 row
at 256 in flight on two B300s (8k prompts) does not fit its prompts and waits a whole decode wave:
56 s TTFT against 2.2 s measured (0.98 s with FP8 KV)."""


def kv_cache_of(row: dict[str, Any]) -> str:
    """The row's KV cache format: FP8 for FP8_KV_MODES, else the checkpoint's own (auto)."""
    return "fp8" if str(row.get("gemm_quant_mode")) in FP8_KV_MODES else "auto"


def _longest(workload: dict[str, Any], kind: str) -> int:
    """The longest prompt or output (`kind`) `workload` draws."""
    return length_bounds(workload[kind], workload.get("random_range_ratio", 0.0))[1]


def _format(mode: Any) -> str | None:
    """A quant mode as a `target.quantization` format: an empty cell is the checkpoint's own (auto);
    None for a mode the testbed has no format for."""
    if mode is None or (isinstance(mode, float) and math.isnan(mode)):
        return "auto"
    return FORMATS.get(str(mode))


def _number(value: Any) -> bool:
    """A present, finite number (a CSV cell read by pandas is NaN where empty)."""
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
