"""Benchmark: the SWE-agent excerpt through `testbed serve` in P/D, one-way against bidirectional KV.

Each case starts `testbed serve` (preset six-turn-l40s: Qwen2.5-7B, one L40S per engine, 400 Gb/s RDMA;
compute skip; emulated time at `--time-scale`), replays the sessions starting in the trace's first
`--window` seconds with `testbed replay --target` and `replay.history=model` (each turn sends the
server's own answer back, as an agent harness does), then stops the server and reads its results: per
turn, the median prompt tokens prefill computed and pulled back from decode, and TTFT.

    one-way              pd-one-way: prefill recomputes each answer decode generated
    bidirectional        pd-bidirectional, verified reuse; the template drops past reasoning (default)
    bidirectional+keep   the same with chat_template_kwargs {keep_past_reasoning: true}
    collocated(+keep)    one engine with prefix caching (what P/D is measured against)
    tools: ...           reasoning kept, a bash tool given (every answer a call), one-way, bidirectional,
                         and bidirectional with the harness re-serialising each call's arguments

    python bench/swe_agent_bidirectional.py [--window 0:3] [--max-turns 8] [--out runs/bench-swe-bidi.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.factories import swe_agent_through_serve  # noqa: E402

KEEP = "replay.chat_template_kwargs={keep_past_reasoning: true}"
BASH = (
    "replay.tools=[{type: function, function: {name: bash, parameters: {type: object,"
    " properties: {command: {type: string}}, required: [command]}}}]"
)
CASES = [
    ("one-way", "pd-one-way", []),
    ("bidirectional", "pd-bidirectional", []),
    ("bidirectional+keep", "pd-bidirectional", [KEEP]),
    ("collocated", "collocated", []),
    ("collocated+keep", "collocated", [KEEP]),
    ("tools: one-way", "pd-one-way", [KEEP, BASH]),
    ("tools: bidirectional", "pd-bidirectional", [KEEP, BASH]),
    ("tools: reserialized", "pd-bidirectional", [KEEP, BASH, "replay.harness_edit=reserialize_tool_calls"]),
]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--window", default="0:3", help="sessions starting in these trace seconds")
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--time-scale", type=float, default=0.2, help="wall seconds per emulated second")
    p.add_argument("--out", default="runs/bench-swe-bidi.json")
    args = p.parse_args()
    rows = []
    for name, design, sets in CASES:
        with TemporaryDirectory() as tmp:
            df = swe_agent_through_serve(
                Path(tmp),
                design,
                *sets,
                window=args.window,
                max_turns=args.max_turns,
                time_scale=args.time_scale,
            )
        for turn, part in df.groupby("turn"):
            rows.append(
                {
                    "case": name,
                    "turn": int(turn),
                    "num_requests": len(part),
                    "prompt_tokens": float(part["num_prompt_tokens"].median()),
                    "computed_tokens": float(part["prompt_computed_tokens"].median()),
                    "pulled_back_tokens": float(part["prefill_pulled_back_tokens"].fillna(0).median()),
                    "ttft_ms": round(float(part["ttft_s"].median()) * 1e3, 1),
                }
            )
        mean = df[df["turn"] > 1]
        print(
            f"{name:22s} turns 2+: computed {mean['prompt_computed_tokens'].mean():7.0f} per turn, "
            f"pulled back {mean['prefill_pulled_back_tokens'].fillna(0).mean():6.0f}, "
            f"TTFT p50 {mean['ttft_s'].median() * 1e3:6.1f} ms",
            flush=True,
        )
    table = pd.DataFrame(rows)
    print(table.pivot(index="turn", columns="case", values="computed_tokens").to_string())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
