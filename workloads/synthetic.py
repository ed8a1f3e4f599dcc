"""The guide's synthetic workload: Poisson arrivals, random fixed-length prompts and answers.

Like `vllm bench serve --dataset-name random`: prompt tokens drawn uniformly from the runner's
vocabulary (so no two prompts share a prefix block), a fixed answer length, EOS ignored.
Deterministic for a seed.

With images (`workload.images_per_request`), each image is a square grid of random patches (as the
image processor's output: 2 x 2 patches a visual token), its placeholders leading the prompt, like
`vllm bench serve --dataset-name random-mm`::

    [<vs> pad x T <ve>] [<vs> pad x T <ve>] [prompt_len text tokens]

A reused image (`image_reuse`) is an earlier request's, hash and patches alike. Placeholder IDs are the
vocabulary's last three (the engines only ever look at the images' positions and hashes).
"""

from __future__ import annotations

import dataclasses
import math

import blake3
import numpy as np

from messages import ClientRequest, MultiModalItem
from target.config import WorkloadConfig
from workloads.traces.multi_turn import parse_dist


def synthetic_requests(
    w: WorkloadConfig, vocab_size: int, seed: int, pixels: bool = False
) -> list[ClientRequest]:
    """`pixels`: give images their patches (real compute encodes them); else only hashes and sizes."""
    requests = _text_requests(w, vocab_size, seed)
    if w.images_per_request != "constant:0":
        _add_images(requests, w, vocab_size, np.random.default_rng([seed, 11]), pixels)
    return requests


def _text_requests(w: WorkloadConfig, vocab_size: int, seed: int) -> list[ClientRequest]:
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


PATCH_DIM = 3 * 2 * 14 * 14
"""Values per patch (RGB, two frames, 14 x 14 pixels), as the vision encoder reads them."""


def _add_images(
    requests: list[ClientRequest], w: WorkloadConfig, vocab_size: int, rng: np.random.Generator, pixels: bool
) -> None:
    count = parse_dist(w.images_per_request)
    side = max(1, round(math.sqrt(w.image_tokens)))  # visual tokens per side
    pad, start, end = vocab_size - 1, vocab_size - 2, vocab_size - 3
    seen: list[MultiModalItem] = []
    for creq in requests:
        if rng.random() < w.text_only_fraction:
            continue
        head: list[int] = []
        items = []
        for _ in range(max(0, round(count(rng)))):
            if seen and rng.random() < w.image_reuse:
                image = seen[int(rng.integers(len(seen)))]
            else:
                patches = (
                    rng.standard_normal((4 * side * side, PATCH_DIM), dtype=np.float32) if pixels else None
                )
                noise = patches.tobytes() if patches is not None else rng.bytes(16)
                digest = blake3.blake3(noise).hexdigest()
                image = MultiModalItem(digest, 0, side * side, patches, (1, 2 * side, 2 * side))
                seen.append(image)
            items.append(dataclasses.replace(image, offset=len(head) + 1))
            head += [start, *[pad] * image.num_tokens, end]
        creq.prompt_token_ids = head + creq.prompt_token_ids
        creq.mm_items = items
