"""Benchmark: published MoE serving measurements against the time models (docs/validation.md, "MoE").

Nothing is fitted: the efficiencies stay those fitted to the guide's dense L40S low-load medians and the
EP fabric's bandwidth share is an assumed 0.8, so every error below is out of sample. Each case is one
steady step of the published setting (per GPU: its batch, its prompt or KV length), timed by the
testbed's step-time model of that layout; throughput = tokens a GPU computes in the step / step time.
The scheduler, queueing and the CPU work between steps beyond the per-operator model's are outside a
step, so these check the step model only (the preset's runs, `bench/moe_sweep.py`, add the rest).

Sources (each setup as published; *secondary* where only a write-up has it):
1. DeepSeek, "DeepSeek-V3/R1 Inference System Overview" (open-infra-index, day 6) and its profile data:
   H800, prefill EP32 with 16,384 tokens a GPU of 4,096-token prompts; decode EP128 (profile) or EP144
   (service), 128 requests a GPU at 4,096 (profile) or 4,989 (service) tokens of KV; FP8 GEMMs and
   dispatch, BF16 combine; two micro-batches; 32 redundant experts. Whether multi-token prediction ran
   in the decode figures is not stated (the testbed has none).
2. SGLang on 96 H100s (lmsys.org/blog/2025-05-05-large-scale-ep): prefill 4 nodes EP32, 16,384 tokens
   a GPU at 4,096-token prompts: 50,302 tok/s a node; decode 9 nodes EP72, 256 requests a GPU at 2,000
   tokens of KV: 22,282 tok/s a node; MTP off; DP attention, two-batch overlap, 32 redundant experts.
   Two-batch overlap's gain: decode -27 % at 32 tokens a GPU, +25.5 % at 256; prefill +27-35 %.
3. DeepEP (deepseek-ai/DeepEP, low-latency kernels since 2025-06-05): H800, 128 tokens a rank, hidden
   7,168, top-8, FP8 dispatch, BF16 combine: EP8 77 / 114 us, EP32 155 / 273 us, EP256 194 / 360 us
   (dispatch / combine).
4. CloudMatrix384 (arXiv 2506.12708), *secondary* table: Ascend 910C, DeepSeek-R1 INT8, prefill EP32 over
   16 NPUs, 16K tokens a batch at 4K prompts: 5,655 tok/s an NPU.

    python bench/moe_validation.py [--out runs/bench-moe-validation.json]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from cluster.config_load import build_config
from emulation.config import PoolConfig
from emulation.expert_parallel import ExpertParallel
from emulation.profiles import GPUS, MODELS
from emulation.step_shape import StepItem, StepShape
from emulation.time_model import time_model_for

TIME_MODELS = ("aggregate", "operators", "measured")


@dataclass(frozen=True)
class StepCase:
    """One published steady step: `batch` requests a GPU computing `new_tokens` each over `context`."""

    name: str
    gpu: str
    ep: int
    batch: int
    new_tokens: int
    context: int
    published: float
    """Tokens a GPU computes per second (prefill: prompt tokens; decode: output tokens)."""
    dbo: bool = True
    redundant: int = 32


CASES = (
    StepCase("DeepSeek profile, prefill EP32 (H800)", "h800", 32, 4, 4096, 0, 62_713 / 8),
    StepCase("DeepSeek service, prefill EP32 (H800, less cache hits)", "h800", 32, 4, 4096, 0, 32_206 / 8),
    StepCase("SGLang, prefill EP32 (H100)", "h100-sxm", 32, 4, 4096, 0, 50_302 / 8),
    StepCase("CloudMatrix, prefill EP32 dies (910C) *secondary*", "ascend-910c", 16, 4, 4096, 0, 5_655),
    StepCase("DeepSeek profile, decode EP128 (H800)", "h800", 128, 128, 1, 4096, 18_598 / 8),
    StepCase("DeepSeek service, decode EP144 (H800)", "h800", 144, 128, 1, 4989, 14_800 / 8),
    StepCase("SGLang, decode EP72 (H100)", "h100-sxm", 72, 256, 1, 2000, 22_282 / 8),
)
DBO_GAINS = (  # (name, GPU, ep, batch, new tokens, context, published gain of two-batch overlap)
    ("SGLang decode, 32 tokens a GPU", "h100-sxm", 72, 32, 1, 2000, -0.27),
    ("SGLang decode, 256 tokens a GPU", "h100-sxm", 72, 256, 1, 2000, 0.255),
    ("SGLang prefill, 8,192 tokens a GPU (+27-35 %)", "h100-sxm", 32, 2, 4096, 0, 0.31),
)
DEEPEP = ((8, 77e-6, 114e-6), (32, 155e-6, 273e-6), (256, 194e-6, 360e-6))  # ep, dispatch, combine (s)


def layout(gpu: str, ep: int, time_model: str, dbo: bool = True, redundant: int = 32) -> dict:
    """A DeepSeek-V3 config of one EP replica with DP attention (the step models read only this)."""
    pool = {"replicas": 1, "gpu": gpu, "ep": ep, "dp_attention": True, "enable_dbo": dbo}
    pool["num_redundant_experts"] = redundant if (256 + redundant) % ep == 0 else 0
    return {
        # measured: H800 and the 910C have no kernel tables, so their steps stay on the roofline
        "target": {"model": "deepseek-v3", "time_model": time_model, "measured_fallback": "roofline"},
        "pools": {"mixed": pool},
        "scheduler": {"block_size": 64},
        "workload": {"prompt_len": 1024, "output_len": 16},
    }


def tokens_per_gpu_s(gpu: str, ep: int, batch: int, new: int, context: int, time_model: str, dbo: bool,
                     redundant: int = 32) -> float:  # fmt: skip
    """Tokens one GPU computes per second in the steady step of the published setting."""
    cfg = build_config(layout(gpu, ep, time_model, dbo, redundant))
    model = time_model_for(cfg, cfg.pools.mixed)
    step = model.step_time_of(StepShape.of([StepItem(new, context, True)] * batch * ep))
    return batch * new / step.total_s


def step_cases(time_model: str) -> list[dict[str, object]]:
    rows = []
    for c in CASES:
        ours = tokens_per_gpu_s(c.gpu, c.ep, c.batch, c.new_tokens, c.context, time_model, c.dbo, c.redundant)
        rows.append(_row(c.name, ours, c.published, "tok/s/GPU"))
    for name, gpu, ep, batch, new, context, gain in DBO_GAINS:
        on, off = (tokens_per_gpu_s(gpu, ep, batch, new, context, time_model, dbo) for dbo in (True, False))
        rows.append({"case": f"two-batch overlap gain: {name}", "ours": round(on / off - 1, 3),
                     "published": gain, "error": round(on / off - 1 - gain, 3), "unit": "gain"})  # fmt: skip
    return rows


def deepep_cases() -> list[dict[str, object]]:
    """DeepEP's low-latency dispatch and combine, 128 tokens a rank, against one all-to-all of ours."""
    rows = []
    for ep, dispatch_s, combine_s in DEEPEP:
        pool = PoolConfig(replicas=1, gpu="h800", ep=ep, dp_attention=True)  # (EP8 leaves no KV room)
        a2a = ExpertParallel(MODELS["deepseek-v3"], GPUS["h800"], pool).all_to_all
        assert a2a is not None
        for what, bytes_per_value, published in (("dispatch", 1.0, dispatch_s), ("combine", 2.0, combine_s)):
            ours = a2a.time_s(128, bytes_per_value)
            rows.append(_row(f"DeepEP low-latency {what}, EP{ep}", ours * 1e6, published * 1e6, "us"))
    return rows


def _row(case: str, ours: float, published: float, unit: str) -> dict[str, object]:
    return {"case": case, "ours": round(ours, 1), "published": round(published, 1),
            "error": round((ours - published) / published, 3), "unit": unit}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench-moe-validation.json"))
    args = parser.parse_args()
    out = {tm: step_cases(tm) for tm in TIME_MODELS}
    out["all_to_all"] = deepep_cases()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    for section, rows in out.items():
        print(f"\n{section}")
        for r in rows:
            print(f"  {r['case']:<62} ours {r['ours']:>9} {r['unit']:<9} published {r['published']:>9}  "
                  f"error {r['error']:+.1%}")  # fmt: skip
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()
