"""Benchmark: goodput of encoder disaggregation against images per request (preset epd-a100).

For each of 1 and 4 images per request (400 visual tokens each) and short (400) and long (2,000)
text prompts, the highest Poisson rate at which at least 99 % of requests meet the preset's SLO
(TTFT <= 20 s, TPOT <= 100 ms), found by doubling then bisecting (to 2 %), for four A100s running
everything (`all-in-one`) against one encoder and three LM instances (`e-pd`). Virtual mode, compute
skip, 400 requests a point; emulated figures only.

    python bench/epd_goodput.py [--out runs/bench-epd-goodput.json] [--plot docs/img/epd_goodput.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from cluster.config_load import load_designs
from cluster.virtual import run_virtual

DESIGNS = ("all-in-one", "e-pd")


def attainment(design: str, images: int, prompt_len: int, rate: float) -> float:
    sets = [f"workload.images_per_request=constant:{images}", f"workload.prompt_len={prompt_len}",
            f"workload.rate={rate}", "workload.num_requests=400", "runner.compute=skip"]  # fmt: skip
    (cfg,) = load_designs("epd-a100", [design], sets)
    out = run_virtual(cfg)
    return float(next(iter(out.summary["slo_attainment"].values())))


def goodput(design: str, images: int, prompt_len: int) -> float:
    """The highest rate (req/s) with >= 99 % SLO attainment."""
    lo, hi = 0.0, 1.0
    while attainment(design, images, prompt_len, hi) >= 0.99:
        lo, hi = hi, hi * 2
    while hi - lo > 0.02 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if attainment(design, images, prompt_len, mid) >= 0.99 else (lo, mid)
    return round(lo, 2)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="runs/bench-epd-goodput.json")
    p.add_argument("--plot", default="docs/img/epd_goodput.png")
    args = p.parse_args()
    rows = []
    for prompt_len in (400, 2000):
        for images in (1, 4):
            row = {"prompt_len": prompt_len, "images": images}
            row.update({d: goodput(d, images, prompt_len) for d in DESIGNS})
            row["ratio"] = round(row["e-pd"] / row["all-in-one"], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=False)
    for ax, prompt_len in zip(axes, (400, 2000), strict=True):
        part = [r for r in rows if r["prompt_len"] == prompt_len]
        for d in DESIGNS:
            ax.plot([r["images"] for r in part], [r[d] for r in part], marker="o", label=d)
        ax.set(title=f"{prompt_len}-token text", xlabel="images per request", ylabel="goodput (req/s)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("Goodput (>= 99 % within TTFT 20 s, TPOT 100 ms), four A100s, Qwen2.5-VL-7B")
    fig.tight_layout()
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
