"""Wrong tokens, measured: each request's output against the same request served by a reference design
(collocated with prefix caching), greedy tokens from real logits. A KV reuse that loads KV computed for
other tokens (positional pull back after an edited history) shows as a first differing position."""

from __future__ import annotations

from typing import cast

import pandas as pd


def diverged_at(results: pd.DataFrame, reference: str) -> pd.Series:
    """Per row: the first output position where its tokens differ from the `reference` design's row for
    the same request (request id, rate, seed); NaN where they agree, where the reference has no such
    row, and on the reference's own rows."""
    key = ["request_id", "rate", "seed"]
    ref = results[results["design"] == reference].set_index(key)["output_token_ids"]
    out = []
    for row in results.itertuples(index=False):
        theirs = ref.get((row.request_id, row.rate, row.seed)) if row.design != reference else None
        if theirs is None:
            out.append(float("nan"))
            continue
        ours, theirs = list(cast("list[int]", row.output_token_ids)), list(cast("list[int]", theirs))
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)
        if first is None and len(ours) != len(theirs):
            first = min(len(ours), len(theirs))
        out.append(float("nan") if first is None else float(first))
    return pd.Series(out, index=results.index, dtype=float)
