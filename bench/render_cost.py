"""Benchmark: the render tier's CPU time per chat request, fitted to `render.s_per_call` +
`render.s_per_prompt_token`, and per image, fitted to `render.s_per_image` + `render.s_per_image_pixel`
(the cost model a replayed run puts on each request's path).

Renders chat requests of several prompt lengths (a system and a user message of mixed prose, code and
numbers, through the chat template and the project's BPE tokenizer, as `testbed serve` renders them),
takes each length's median thread CPU time over repeats, and fits a line by least squares on relative
error (so short prompts weigh as much as long ones). Then processes JPEG photos-like images (smooth
gradients with noise, quality 90) of several sizes, already at the target's processed size (so the
resize is a no-op, as for a client that sends what the model reads), through the target's image
processor (decode, normalise, patches, hash), and fits CPU seconds per image and per processed pixel
the same way. Prints the fits, the shipped defaults and their ratios; writes everything to `--out`.

    python bench/render_cost.py [--lengths 32,128,...,32768] [--repeats 15] [--model qwen3-vl-4b]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import time
from pathlib import Path

import numpy as np
from PIL import Image

from actors.render.images import process_image
from actors.render.render import Render
from actors.render.tokenizer import load_tokenizer, training_corpus
from emulation.config import RenderConfig, RunnerConfig
from emulation.vision import vision_encoder_of
from emulation.vision_encoders import VisionEncoderProfile


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


def _photo_url(side: int, rng: np.random.Generator) -> str:
    """A `side` x `side` JPEG data URL of a photo-like picture: gradients, a few shapes, sensor noise."""
    y, x = np.mgrid[0:side, 0:side] / side
    rgb = np.stack([x, y, (x + y) / 2], axis=-1) * 200
    for _ in range(8):  # shapes
        cx, cy, r = rng.random(3) * [1, 1, 0.3]
        rgb[(x - cx) ** 2 + (y - cy) ** 2 < r**2] = rng.integers(0, 256, 3)
    rgb += rng.normal(0, 8, rgb.shape)
    buf = io.BytesIO()
    Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def image_fit(vit: VisionEncoderProfile, repeats: int) -> dict[str, object]:
    """CPU seconds per image (median over repeats) at several processed sizes, and their linear fit
    in processed pixels."""
    token_px = vit.patch_size * vit.merge_size
    rng = np.random.default_rng(0)
    rows = []
    for side_tokens in (8, 14, 20, 28, 40, 56):
        side = side_tokens * token_px
        url = _photo_url(side, rng)
        cpu_s = []
        for _ in range(repeats):
            start = time.thread_time()
            image = process_image(url, "bench", vit)
            cpu_s.append(time.thread_time() - start)
        median_s = float(np.median(cpu_s))
        rows.append({"pixels": side * side, "num_tokens": image.num_tokens, "median_cpu_s": median_s})
    x = np.array([r["pixels"] for r in rows], float)
    y = np.array([r["median_cpu_s"] for r in rows])
    s_per_pixel, s_per_image = np.polyfit(x, y, 1, w=1.0 / y)
    if s_per_image < 0:  # no fixed cost to see: per pixel alone (the relative-error fit through 0)
        s_per_image, s_per_pixel = 0.0, float(np.sum(x / y) / np.sum((x / y) ** 2))
    return {"rows": rows, "fit": {"s_per_image": float(s_per_image), "s_per_image_pixel": float(s_per_pixel)}}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", default="32,128,512,2048,4096,8192,16384,32768")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--model", default="qwen3-vl-4b", help="a vision-language target: its image processor")
    p.add_argument("--out", default="runs/bench-render-cost.json")
    args = p.parse_args()
    vit = vision_encoder_of(args.model)
    if vit is None:
        p.error(f"--model {args.model!r} is text only: a vision-language target is needed")
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
    images = image_fit(vit, args.repeats)
    image_fits: dict[str, float] = images["fit"]  # type: ignore[assignment]
    report = {
        "rows": rows,
        "fit": fit,
        "default": {"s_per_call": default.s_per_call, "s_per_prompt_token": default.s_per_prompt_token},
        "fit_over_default_per_token": float(s_per_token / default.s_per_prompt_token),
        "images": {**images, "model": args.model},
        "image_default": {"s_per_image": default.s_per_image, "s_per_image_pixel": default.s_per_image_pixel},
        "fit_over_default_per_pixel": image_fits["s_per_image_pixel"] / default.s_per_image_pixel,
    }
    for r in rows:
        print(f"{r['num_prompt_tokens']:>7} tokens  {r['median_cpu_s'] * 1e3:8.2f} ms CPU")
    print(
        f"fit: {s_per_call * 1e3:.3f} ms per call + {s_per_token * 1e6:.3f} us per prompt token "
        f"(defaults: {default.s_per_call * 1e3:.3f} ms + {default.s_per_prompt_token * 1e6:.3f} us; "
        f"fit/default per token {report['fit_over_default_per_token']:.2f})"
    )
    for r in images["rows"]:  # type: ignore[attr-defined]
        print(f"{r['pixels']:>9} pixels ({r['num_tokens']:>5} tokens)  {r['median_cpu_s'] * 1e3:8.2f} ms CPU")
    print(
        f"images: {image_fits['s_per_image'] * 1e3:.3f} ms per image + "
        f"{image_fits['s_per_image_pixel'] * 1e9:.2f} ns per pixel (defaults: "
        f"{default.s_per_image * 1e3:.3f} ms + {default.s_per_image_pixel * 1e9:.2f} ns; "
        f"fit/default per pixel {report['fit_over_default_per_pixel']:.2f})"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
