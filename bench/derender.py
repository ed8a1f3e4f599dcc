"""Benchmark: streaming derender, stateless vs stateful, in measured CPU time.

One output stream per length N (reasoning, then text), derendered one token per chunk:
- stateful: the render replica keeps the stream's decoder and incremental parser -> O(N) per stream;
- stateless: every chunk carries the whole history; the replica rebuilds the decoder and a rescanning
  parser (vLLM's streaming parsers re-parse `current_text` on every delta) and replays it -> O(N^2)
  decoder steps and parse calls, each parse scanning O(N) characters: O(N^3) per stream, ~8x per
  doubling of N once the scans outweigh each call's fixed cost.

Stateless CPU is split into the decoder replay (measured with a parser that does nothing) and the
parser; `rescanned_chars` counts the characters the parse calls scan (the cubic term, exactly).

    python bench/derender.py [--lengths 64,128,256,512] [--out runs/bench-derender.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from pathlib import Path

from actors.render.parsers import ParsedDelta
from actors.render.render import Render, _Stream
from actors.render.tokenizer import load_tokenizer
from workloads.answers import forced_answer_ids, forced_answer_text


def _cpu(fn: object) -> float:
    start = time.process_time()
    fn()  # type: ignore[operator]
    return time.process_time() - start


class _NoParser:
    def feed(self, delta: str) -> ParsedDelta:
        return ParsedDelta()

    def finish(self) -> ParsedDelta:
        return ParsedDelta()


def _rescanned_chars(render: Render, ids: list[int]) -> int:
    """Characters the stateless chunks' parse calls scan: chunk i replays prefixes 1..i+1, and each
    parse scans the whole text of its prefix."""
    text_lens = [len(render.detokenize(ids[: k + 1])) for k in range(len(ids))]
    per_chunk = list(itertools.accumulate(text_lens))
    return sum(per_chunk)


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

        def decoder_replay(ids: list[int] = ids) -> None:
            for i in range(len(ids)):
                _Stream(render.tokenizer.backend_tokenizer, _NoParser()).feed(  # type: ignore[arg-type]
                    ids[: i + 1], ParsedDelta()
                )

        stateless_cpu_s = _cpu(stateless)
        decoder_cpu_s = _cpu(decoder_replay)
        rows.append(
            {
                "num_tokens": n,
                "stateful_cpu_s": _cpu(stateful),
                "stateless_cpu_s": stateless_cpu_s,
                "stateless_decoder_cpu_s": decoder_cpu_s,
                "stateless_parser_cpu_s": stateless_cpu_s - decoder_cpu_s,
                "rescanned_chars": _rescanned_chars(render, ids),
            }
        )
    keys = ["stateful_cpu_s", "stateless_cpu_s", "stateless_decoder_cpu_s", "stateless_parser_cpu_s"]
    for prev, row in itertools.pairwise(rows):
        for key in [*keys, "rescanned_chars"]:
            row[key.removesuffix("_cpu_s") + "_growth"] = row[key] / prev[key]
    for row in rows:
        cells = [f"N={row['num_tokens']:5d}"]
        for key in keys:
            growth = row.get(key.removesuffix("_cpu_s") + "_growth", math.nan)
            cells.append(f"{key.removesuffix('_cpu_s')} {row[key] * 1e3:9.1f} ms (x{growth:.2f})")
        chars_growth = row.get("rescanned_chars_growth", math.nan)
        cells.append(f"rescanned {row['rescanned_chars'] / 1e6:8.1f} M chars (x{chars_growth:.2f})")
        print("  ".join(cells))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
