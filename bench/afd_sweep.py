"""Benchmark: the attention:FFN ratio of DeepSeek-V3 decode under attention-FFN disaggregation, against
wide expert parallelism, on H800 nodes, from the time models alone (no replay).

The layout (preset deepseek-v3-afd-h800's): attention ranks of one H800 each (MLA, FP8 weights, their own
requests and KV) and FFN ranks of `--ffn-ep` H800s holding every expert (expert-parallel inside the
rank), FP8 out with the expert choices, BF16 back, over 400 Gb/s NICs, three micro-batches. For each
number of attention ranks A per FFN rank: the largest decode batch per attention rank (4K-token
contexts) whose step meets the TPOT SLO (50 ms, Step-3's), its step itemised (T_a, T_e, T_c a layer;
each side's idle share; what the transfers exposed) and the decode tokens per second per GPU (attention
and FFN GPUs together). The EP baseline: DeepSeek-style decode (data-parallel attention, 32 redundant
experts, dual-batch overlap) at several EP widths, the same search. Then the micro-batch count at the
best ratio. Emulated figures only; the per-operator efficiencies are the defaults (fitted on L40S dense
runs, nothing to DeepSeek or AFD).

    python bench/afd_sweep.py [--ffn-ep 32] [--tpot-ms 50] [--context 4096]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from afd_points import decodes, largest_batch  # bench/, beside this script

from emulation.config import PoolConfig, TestbedConfig
from emulation.time_model import StepTimeModel, time_model_for

RATIOS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
EP_WIDTHS = (32, 72, 144)
DISPATCH = ["rank"]
MAX_BATCH = 512
"""Most decodes an attention rank runs in one step (KV permitting at 4K contexts on an H800)."""


def target() -> TestbedConfig:
    from cluster.config_load import load_designs

    (cfg,) = load_designs("deepseek-v3-afd-h800", ["pd-afd-32a1f"], ["runner.compute=skip"])
    return cfg


def afd_pool(cfg: TestbedConfig, num_attention: int, ffn_ep: int, micro_batches: int) -> PoolConfig:
    afd = cfg.pools.decode.afd
    assert afd is not None
    changed = dataclasses.replace(
        afd,
        num_attention_ranks=num_attention,
        ffn_ep=ffn_ep,
        num_micro_batches=micro_batches,
        dispatch=DISPATCH[0],
    )
    return dataclasses.replace(cfg.pools.decode, afd=changed)


def ep_pool(ep: int) -> PoolConfig:
    return PoolConfig(
        replicas=1, gpu="h800", ep=ep, dp_attention=True, num_redundant_experts=32, enable_dbo=True
    )


def best_batch(num_ranks: int, model: StepTimeModel, tpot_s: float, context: int) -> int:
    """The largest batch per rank (<= MAX_BATCH) of decodes over `context`-token contexts whose step
    takes at most `tpot_s` (0: none does)."""

    def step_s(n: int) -> float:
        return float(model.step_time_of(decodes(num_ranks * n, context - 1)).total_s)

    return largest_batch(step_s, MAX_BATCH, tpot_s)[0]


def afd_row(cfg: TestbedConfig, a: int, ffn_ep: int, m: int, tpot_s: float, context: int) -> list[str]:
    pool = afd_pool(cfg, a, ffn_ep, m)
    model: StepTimeModel = time_model_for(cfg, pool)
    b = best_batch(a, model, tpot_s, context)
    if not b:
        return [f"{a}:1", str(pool.num_gpus), "0", *["-"] * 7]
    step = model.step_time_of(decodes(a * b, context - 1))
    p = step.pipeline  # type: ignore[attr-defined]  # an AfdStepTime
    return [
        f"{a}:1",
        str(pool.num_gpus),
        str(b),
        f"{1000 * step.total_s:.1f}",
        f"{1e6 * step.attention_layer_s:.0f}",  # type: ignore[attr-defined]
        f"{1e6 * step.ffn_layer_s:.0f}",  # type: ignore[attr-defined]
        f"{1e6 * max(step.a2f_s, step.f2a_s):.0f}",  # type: ignore[attr-defined]
        f"{100 * p.attention_bubble_s / step.total_s:.0f}",
        f"{100 * p.ffn_s / step.total_s:.0f}",
        f"{a * b / step.total_s / pool.num_gpus:,.0f}",
    ]


def ep_row(cfg: TestbedConfig, ep: int, tpot_s: float, context: int) -> list[str]:
    pool = ep_pool(ep)
    model = time_model_for(cfg, pool)
    b = best_batch(ep, model, tpot_s, context)
    step = model.step_time_of(decodes(ep * b, context - 1))
    return [f"EP{ep}", str(pool.num_gpus), str(b), f"{1000 * step.total_s:.1f}", *["-"] * 5,
            f"{ep * b / step.total_s / pool.num_gpus:,.0f}"]  # fmt: skip


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [" | ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("-|-".join("-" * w for w in widths))
    lines += [" | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


HEADERS = ["A:F", "GPUs", "batch/rank", "TPOT ms", "T_a us", "T_e us", "T_c us", "attn idle %",
           "FFN busy %", "tok/s/GPU"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ffn-ep", type=int, default=32, help="GPUs of an FFN rank (default 32)")
    parser.add_argument("--tpot-ms", type=float, default=50.0, help="TPOT SLO (default 50)")
    parser.add_argument("--context", type=int, default=4096, help="tokens of each decode's context")
    parser.add_argument("--dispatch", choices=["rank", "expert"], default="rank")
    args = parser.parse_args()
    DISPATCH[0] = args.dispatch
    start, cfg, tpot_s = time.perf_counter(), target(), args.tpot_ms / 1000
    rows = [afd_row(cfg, a, args.ffn_ep, 3, tpot_s, args.context) for a in RATIOS]
    rows += [ep_row(cfg, ep, tpot_s, args.context) for ep in EP_WIDTHS]
    print(f"DeepSeek-V3 decode on H800, FFN ranks of {args.ffn_ep} GPUs, 3 micro-batches, "
          f"TPOT <= {args.tpot_ms:g} ms, {args.context}-token contexts")  # fmt: skip
    print(table(HEADERS, rows))
    best = max(rows[: len(RATIOS)], key=lambda r: 0.0 if r[-1] == "-" else float(r[-1].replace(",", "")))
    a = int(best[0].split(":")[0])
    print(f"\nmicro-batches at {a}:1")
    print(
        table(
            ["m", *HEADERS],
            [[str(m), *afd_row(cfg, a, args.ffn_ep, m, tpot_s, args.context)] for m in (1, 2, 3, 4)],
        )
    )
    print(f"\n{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
