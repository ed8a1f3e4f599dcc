"""The guide's synthetic workload: Poisson arrivals, random prompts and answers of fixed lengths.

Like `vllm bench serve --dataset-name random`: prompt tokens drawn uniformly from the runner's
vocabulary (so no two prompts share a prefix block), a fixed answer length, EOS ignored; with
`workload.random_range_ratio` R, each request's lengths drawn around the nominal ones as its
`--random-range-ratio` draws them (`length_bounds`). Deterministic for a seed. Under
`workload.max_concurrency` the arrival times are not used: `workloads.closed_loop` sends the requests
in order, each when a slot frees.

With images (`workload.images_per_request`), like `vllm bench serve --dataset-name random-mm`: each a
square grid of `image_tokens` (`workloads.images`), its placeholders leading the prompt; a reused image
(`image_reuse`) is an earlier request's, hash and patches alike.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from emulation.config import WorkloadConfig
from messages import ClientRequest, MultiModalItem
from messages.token_ids import TokenIds
from workloads.images import synthetic_image, with_images
from workloads.traces.multi_turn import parse_dist


def synthetic_requests(
    w: WorkloadConfig, vocab_size: int, seed: int, patch_size: int | None = None
) -> list[ClientRequest]:
    """`patch_size`: give images patches of that many pixels a side (real compute encodes them); None:
    only hashes and sizes."""
    requests = _text_requests(w, vocab_size, seed)
    if w.images_per_request != "constant:0":
        _add_images(requests, w, vocab_size, np.random.default_rng([seed, 11]), patch_size)
    return requests


def _text_requests(w: WorkloadConfig, vocab_size: int, seed: int) -> list[ClientRequest]:
    if w.random_range_ratio == 0:  # fixed lengths: the very draws of runs before the ratio existed
        std_gaps, prompts, answers = _draws(seed, w.num_requests, w.prompt_len, w.output_len, vocab_size)
    else:
        ranges = prompt_len_bounds(w), output_len_bounds(w)
        std_gaps, prompts, answers = _ranged_draws(seed, w.num_requests, *ranges, vocab_size)
    gaps = std_gaps * (1.0 / w.rate)  # numpy's exponential(scale) is this product, bit for bit
    gaps[0] = 0.0  # the first request goes out at t=0, as a benchmark client sends it
    arrivals = np.cumsum(gaps)
    return [
        ClientRequest(
            request_id=f"req-{i:05d}",
            arrival_s=float(arrivals[i]),
            prompt_token_ids=prompts[i],
            max_tokens=len(answers[i]),
            forced_output_token_ids=answers[i] if w.output_policy == "forced" else None,
        )
        for i in range(w.num_requests)
    ]


def length_bounds(nominal: int, ratio: float) -> tuple[int, int]:
    """The lengths a request of `nominal` tokens may have under range ratio `ratio`, both ends included:
    vLLM's `[floor(L x (1 - R)), ceil(L x (1 + R))]` (`benchmarks.datasets.utils.get_sampling_params`,
    float for float: 100 at 0.1 is [90, 111], since 100 x 1.1 is 110.00000000000001)."""
    return math.floor(nominal * (1 - ratio)), math.ceil(nominal * (1 + ratio))


def prompt_len_bounds(w: WorkloadConfig) -> tuple[int, int]:
    """A synthetic request's shortest and longest prompt (vLLM refuses a shortest of 0: a config rule)."""
    return length_bounds(w.prompt_len, w.random_range_ratio)


def output_len_bounds(w: WorkloadConfig) -> tuple[int, int]:
    """A synthetic request's shortest and longest answer, at least 1 token (as vLLM's)."""
    low, high = length_bounds(w.output_len, w.random_range_ratio)
    return max(low, 1), max(high, 1)


@functools.lru_cache(maxsize=2)
def _draws(
    seed: int, num_requests: int, prompt_len: int, output_len: int, vocab_size: int
) -> tuple[np.ndarray, list[TokenIds], list[list[int]]]:
    """A seed's standard exponential gaps, prompts and answers. Kept for the next run of the same
    workload at another rate or design (a sweep's points share them): never changed. Prompts are
    `TokenIds` (8k-token prompts as Python lists cost more to make than a short run, and every cycle
    collection until they age visits each int)."""
    rng = np.random.default_rng(seed)
    std_gaps = rng.standard_exponential(num_requests)
    prompts = rng.integers(0, vocab_size, size=(num_requests, prompt_len))
    answers = rng.integers(0, vocab_size, size=(num_requests, output_len))
    return std_gaps, [TokenIds(p) for p in prompts], [a.tolist() for a in answers]


@functools.lru_cache(maxsize=2)
def _ranged_draws(
    seed: int,
    num_requests: int,
    prompt_range: tuple[int, int],
    output_range: tuple[int, int],
    vocab_size: int,
) -> tuple[np.ndarray, list[TokenIds], list[list[int]]]:
    """`_draws` with each request's lengths drawn uniformly from the ranges (both ends included), as
    vLLM's RandomDataset draws them (every prompt length, then every output length); the same gaps as
    `_draws` for the seed. Never changed, as `_draws`."""
    rng = np.random.default_rng(seed)
    std_gaps = rng.standard_exponential(num_requests)
    prompt_lens = rng.integers(prompt_range[0], prompt_range[1] + 1, size=num_requests)
    output_lens = rng.integers(output_range[0], output_range[1] + 1, size=num_requests)
    prompts = [TokenIds(rng.integers(0, vocab_size, size=int(n))) for n in prompt_lens]
    answers = [rng.integers(0, vocab_size, size=int(n)).tolist() for n in output_lens]
    return std_gaps, prompts, answers


def _add_images(
    requests: list[ClientRequest],
    w: WorkloadConfig,
    vocab_size: int,
    rng: np.random.Generator,
    patch_size: int | None,
) -> None:
    count = parse_dist(w.images_per_request)
    side = max(1, round(math.sqrt(w.image_tokens)))  # a square grid of visual tokens
    seen: list[MultiModalItem] = []
    for creq in requests:
        if rng.random() < w.text_only_fraction:
            continue
        images = []
        for _ in range(max(0, round(count(rng)))):
            if seen and rng.random() < w.image_reuse:
                images.append(seen[int(rng.integers(len(seen)))])
            else:
                seen.append(synthetic_image(rng, side * side, patch_size))
                images.append(seen[-1])
        creq.prompt_token_ids, creq.mm_items = with_images(creq.prompt_token_ids, images, vocab_size)
