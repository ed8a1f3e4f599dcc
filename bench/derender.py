"""Benchmark: streaming derender, stateless vs stateful, in measured CPU time.

One output stream per length N (reasoning, then text), derendered one token per chunk:
- stateful: the render replica keeps the stream's decoder and incremental parser -> O(N) per stream;
- stateless: every chunk carries the whole history; the replica rebuilds the decoder and a rescanning
  parser (vLLM's streaming parsers re-parse `current_text` on every delta) and replays it -> O(N^2)
  decoder steps, each parse O(N): O(N^3) per stream, i.e. ~8x per doubling of N.

    python bench/derender.py [--lengths 64,128,256,512] [--out runs/bench-derender.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from pathlib import Path

from actors.render.render import Render
from actors.render.tokenizer import load_tokenizer
from workloads.answers import forced_answer_ids, forced_answer_text


def _cpu(fn: object) -> float:
    start = time.process_time()
    fn()  # type: ignore[operator]
    return time.process_time() - start


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", default="64,128,256,512")
    p.add_argument("--out", default="runs/bench-derender.json")
    args = p.parse_args()
    render = Render(load_tokenizer(None, 8192))
    rows = []
    for n in [int(x) for x in args.lengths.split(",")]:
        text = forced_answer_text([{"role": "user", "content": "bench"}], None, 0, n)
        ids = forced_answer_ids(text, render.render_text, n, render.eos_token_id, False)

        def stateful(ids: list[int] = ids) -> None:
            for i in range(len(ids)):
                render.derender("bench", ids[i : i + 1], i == len(ids) - 1)

        def stateless(ids: list[int] = ids) -> None:
            for i in range(len(ids)):
                render.derender_stateless(ids[: i + 1], i, i == len(ids) - 1)

        rows.append({"num_tokens": n, "stateful_cpu_s": _cpu(stateful), "stateless_cpu_s": _cpu(stateless)})
    for prev, row in itertools.pairwise(rows):
        row["stateful_growth"] = row["stateful_cpu_s"] / prev["stateful_cpu_s"]
        row["stateless_growth"] = row["stateless_cpu_s"] / prev["stateless_cpu_s"]
    for row in rows:
        growth = (row.get("stateful_growth", math.nan), row.get("stateless_growth", math.nan))
        print(
            f"N={row['num_tokens']:5d}  stateful {row['stateful_cpu_s'] * 1e3:9.1f} ms CPU (x{growth[0]:.2f})"
            f"   stateless {row['stateless_cpu_s'] * 1e3:10.1f} ms CPU (x{growth[1]:.2f})"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
