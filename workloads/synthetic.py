"""The guide's synthetic workload: Poisson arrivals, random fixed-length prompts and answers.

Like `vllm bench serve --dataset-name random`: prompt tokens drawn uniformly from the runner's
vocabulary (so no two prompts share a prefix block), a fixed answer length, EOS ignored.
Deterministic for a seed.
"""

from __future__ import annotations

import numpy as np

from messages import ClientRequest
from target.config import WorkloadConfig


def synthetic_requests(w: WorkloadConfig, vocab_size: int, seed: int) -> list[ClientRequest]:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / w.rate, size=w.num_requests)
    gaps[0] = 0.0  # the first request goes out at t=0, as a benchmark client sends it
    arrivals = np.cumsum(gaps)
    prompts = rng.integers(0, vocab_size, size=(w.num_requests, w.prompt_len))
    answers = rng.integers(0, vocab_size, size=(w.num_requests, w.output_len))
    return [
        ClientRequest(
            request_id=f"req-{i:05d}",
            arrival_s=float(arrivals[i]),
            prompt_token_ids=prompts[i].tolist(),
            max_tokens=w.output_len,
            forced_output_token_ids=answers[i].tolist() if w.output_policy == "forced" else None,
        )
        for i in range(w.num_requests)
    ]
