"""Benchmark: the render tier's CPU time per chat request, fitted to `render.s_per_call` +
`render.s_per_prompt_token` (the cost model a replayed run puts on each request's path).

Renders chat requests of several prompt lengths (a system and a user message of mixed prose, code and
numbers, through the chat template and the project's BPE tokenizer, as `testbed serve` renders them),
takes each length's median thread CPU time over repeats, and fits a line by least squares on relative
error (so short prompts weigh as much as long ones). Prints the
fit, the shipped defaults and their ratio; writes everything to `--out`.

    python bench/render_cost.py [--lengths 32,128,...,32768] [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from actors.render.render import Render
from actors.render.tokenizer import load_tokenizer, training_corpus
from target.config import RenderConfig, RunnerConfig


def _messages(lines: list[str], num_tokens: int, render: Render) -> list[dict[str, str]]:
    """A chat request of about `num_tokens` prompt tokens: corpus lines until the length is reached."""
    words: list[str] = []
    i = 0
    while len(render.render_text("\n".join(words))) < num_tokens:
        words.extend(lines[i : i + 4])
        i += 4
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "\n".join(words)},
    ]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", default="32,128,512,2048,4096,8192,16384,32768")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", default="runs/bench-render-cost.json")
    args = p.parse_args()
    render = Render(load_tokenizer(None, RunnerConfig().vocab_size))
    lines = [line for line in training_corpus(seed=1) if "<|im_start|>" not in line]  # content only
    rows = []
    for n in [int(x) for x in args.lengths.split(",")]:
        messages = _messages(lines, n, render)
        cpu_s = []
        for _ in range(args.repeats):
            start = time.thread_time()
            ids = render.render_chat(messages)
            cpu_s.append(time.thread_time() - start)
        rows.append({"num_prompt_tokens": len(ids), "median_cpu_s": float(np.median(cpu_s))})
    x = np.array([r["num_prompt_tokens"] for r in rows], float)
    y = np.array([r["median_cpu_s"] for r in rows])
    s_per_token, s_per_call = np.polyfit(x, y, 1, w=1.0 / y)  # relative error: short and long alike
    default = RenderConfig()
    fit = {"s_per_call": float(s_per_call), "s_per_prompt_token": float(s_per_token)}
    report = {
        "rows": rows,
        "fit": fit,
        "default": {"s_per_call": default.s_per_call, "s_per_prompt_token": default.s_per_prompt_token},
        "fit_over_default_per_token": float(s_per_token / default.s_per_prompt_token),
    }
    for r in rows:
        print(f"{r['num_prompt_tokens']:>7} tokens  {r['median_cpu_s'] * 1e3:8.2f} ms CPU")
    print(
        f"fit: {s_per_call * 1e3:.3f} ms per call + {s_per_token * 1e6:.3f} us per prompt token "
        f"(defaults: {default.s_per_call * 1e3:.3f} ms + {default.s_per_prompt_token * 1e6:.3f} us; "
        f"fit/default per token {report['fit_over_default_per_token']:.2f})"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
