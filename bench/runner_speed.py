"""Benchmark: how the runner model's real compute compares with the emulated target's step budget.

For candidate runner sizes, times one 8,192-token prefill (four 2,048-token chunks) and batched decode
steps at 8k context, and reports real / emulated ratios for Qwen2.5-7B on an L40S (η fitted as in the
guide preset). A ratio below 1 means the runner keeps up at time_scale 1 in live mode.

    python bench/runner_speed.py
"""

from __future__ import annotations

import json
import statistics
import sys
import timeit

import torch

from actors.engine.runner.model_runner import ModelRunner, RunnerInput
from actors.engine.runner.tiny_model import load_model
from emulation.config import RunnerConfig
from emulation.profiles import GPUS, MODELS
from emulation.roofline import Roofline
from emulation.step_shape import StepItem

SIZES = [(64, 2, 4, 2), (128, 2, 4, 2)]
TARGET = Roofline(MODELS["qwen2.5-7b"], GPUS["l40s"], eta_compute=0.47, eta_bandwidth=0.75, overhead_s=0.002)


def _p50(fn, repeat: int) -> float:
    return statistics.median(timeit.repeat(fn, number=1, repeat=repeat))


def measure(hidden: int, layers: int, heads: int, kv_heads: int) -> dict:
    cfg = RunnerConfig(
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=4 * hidden,
    )
    runner = ModelRunner(load_model(cfg), num_blocks=600, block_size=16)
    prompt = torch.randint(0, cfg.vocab_size, (8192,)).tolist()
    blocks = list(range(520))

    def prefill():
        for c in range(4):
            runner.execute(
                [RunnerInput("p", prompt[c * 2048 : (c + 1) * 2048], c * 2048, blocks, 8500, c == 3)]
            )
        runner.release("p")

    prefill_s = _p50(prefill, 2)
    runner.execute([RunnerInput("p", prompt, 0, blocks, 8500, True)])
    base = runner._working["p"]
    row = {
        "runner": f"hidden {hidden}, layers {layers}, heads {heads}, kv heads {kv_heads}",
        "kv_bytes_per_token": runner.kv_bytes_per_token,
        "prefill_8192_ms": round(prefill_s * 1e3, 1),
        "prefill_ratio": round(
            prefill_s / sum(TARGET.step_time([StepItem(2048, c * 2048, c == 3)]).total_s for c in range(4)), 2
        ),
    }
    for batch in (1, 8, 32):
        for i in range(batch):
            runner._working[f"d{i}"] = base.clone()
        items = [RunnerInput(f"d{i}", [1], 8192, blocks, 8500, True) for i in range(batch)]
        step_s = _p50(lambda items=items: runner.execute(items), 5)
        emulated = TARGET.step_time([StepItem(1, 8192, True)] * batch).total_s
        row[f"decode_{batch}x8k_ms"] = round(step_s * 1e3, 1)
        row[f"decode_{batch}x8k_ratio"] = round(step_s / emulated, 2)
    return row


def main() -> int:
    torch.set_num_threads(1)
    rows = [measure(*size) for size in SIZES]
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
