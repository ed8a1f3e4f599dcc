"""Benchmark: published vLLM measurements reproduced by the testbed, on each time model (docs/validation.md).

Nothing here is fitted: the efficiencies stay those fitted to the guide's L40S low-load medians, so every
figure is out of sample. Each case states the published setting; the testbed runs the same one in
virtual mode (compute skip) and the error is (testbed - published) / published.

1. vLLM's performance benchmark, latency tests (buildkite.com/vllm/performance-benchmark/builds/
   9523 on A100-SXM4-80GB, 9555 on H100, 9515 on H200): a batch of 8 requests of 32 prompt tokens and
   128 output tokens, end-to-end latency (mean): Llama-3.1-8B at TP 1 and Llama-3-70B at TP 4
   (Llama-3.1-70B's geometry).
2. The vLLM EPD blog (blog.vllm.ai/2025/12/15/vllm-epd.html): goodput of 1 encoder + 3 PD instances
   and of 4 data-parallel instances on 4 x A100 80GB, Qwen3-VL-4B, 400 / 2,000 text tokens, 1 / 4
   images of ~400 visual tokens, 150 output tokens, p99 TTFT 20 s and p99 TPOT 100 ms; the testbed's
   figures come from `bench/epd_goodput.py` (--epd JSON).

    python bench/validation.py [--epd runs/bench-epd-goodput.json] [--out runs/bench-validation.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from cluster.config_load import build_config
from cluster.virtual import run_virtual

TIME_MODELS = ("aggregate", "operators", "measured")
LATENCY_TESTS = [  # (name, model, GPU, TP, published mean latency ms), one buildkite build a GPU
    ("latency_llama8B_tp1", "llama-3.1-8b", "a100-80gb", 1, 1579.27),  # build 9523
    ("latency_llama70B_tp4", "llama-3.1-70b", "a100-80gb", 4, 3990.59),
    ("latency_llama8B_tp1", "llama-3.1-8b", "h100-sxm", 1, 997.542),  # build 9555
    ("latency_llama70B_tp4", "llama-3.1-70b", "h100-sxm", 4, 2444.47),
    ("latency_llama8B_tp1", "llama-3.1-8b", "h200", 1, 833.421),  # build 9515
    ("latency_llama70B_tp4", "llama-3.1-70b", "h200", 4, 2077.53),
]
EPD_BLOG = {  # (text tokens, images) -> (1E3PD goodput, DP-4 goodput), req/s
    (400, 1): (24.0, 23.0),
    (400, 4): (12.0, 6.0),
    (2000, 1): (18.0, 8.0),
    (2000, 4): (8.0, 4.0),
}


def latency_test(model: str, gpu: str, tp: int, time_model: str) -> float:
    """Mean end-to-end latency (ms) of 8 requests sent together: 32 prompt tokens, 128 out."""
    cfg = build_config(
        {
            "pools": {"mixed": {"replicas": 1, "gpu": gpu, "tp": tp}},
            "target": {"model": model, "time_model": time_model},
            "runner": {"compute": "skip"},
            "workload": {"prompt_len": 32, "output_len": 128, "num_requests": 8, "rate": 1e9},
        }
    )
    df = run_virtual(cfg).results
    return float((df["e2el_s"]).mean() * 1e3)


def error(testbed: float, published: float) -> float:
    return round((testbed - published) / published, 3)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--epd", nargs="*", default=["runs/bench-epd-goodput.json"],
                   help="bench/epd_goodput.py's outputs (one per time model)")  # fmt: skip
    p.add_argument("--out", default="runs/bench-validation.json")
    args = p.parse_args()
    rows = []
    for name, model, gpu, tp, published in LATENCY_TESTS:
        row: dict[str, object] = {"case": f"{name}_{gpu}", "published": published}
        for tm in TIME_MODELS:
            ms = latency_test(model, gpu, tp, tm)
            row[tm] = round(ms, 1)
            row[f"{tm}_error"] = error(ms, published)
        rows.append(row)
    epd: dict[str, dict[str, object]] = {}  # one row per case, a column pair per time model
    for path in args.epd:
        if not Path(path).exists():
            continue
        bench = json.loads(Path(path).read_text())
        tm = bench.get("time_model", "aggregate")
        for r in bench["goodput"]:
            for design, i in (("e-pd", 0), ("all-in-one", 1)):
                published = EPD_BLOG[(r["prompt_len"], r["images"])][i]
                case = f"epd_{design}_{r['prompt_len']}_text_{r['images']}_img"
                row = epd.setdefault(case, {"case": case, "published": published})
                row.update({tm: r[design], f"{tm}_error": error(r[design], published)})
    rows += epd.values()
    for row in rows:
        print(json.dumps(row))
    for tm in TIME_MODELS:
        errs = [abs(float(r[f"{tm}_error"])) for r in rows if f"{tm}_error" in r]  # type: ignore[arg-type]
        print(f"{tm}: median |error| {statistics.median(errs):.1%} over {len(errs)} figures")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
