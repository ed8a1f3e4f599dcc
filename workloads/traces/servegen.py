"""ServeGen per-client characterizations (Alibaba Bailian): sampled into requests, not replayed.

A directory of `chunk-<client>-trace.csv` (one row per 600 s window of a day: `window_start_s, rate,
cv, pattern (Gamma|Weibull|empty), shape, scale`) and `chunk-<client>-dataset.json` (per 6-hour window,
each field a PMF `{value: probability}` written as a Python dict literal). For each chosen client and
each 600 s window overlapping the replay window, arrivals are drawn from the window's fitted
inter-arrival distribution rescaled to its rate (as ServeGen's generator does), and each request's
lengths from that time's PMFs: prompt = text + audio + video tokens and `image_count` images of
`image_tokens` visual tokens each (multimodal: sent as images to a vision-language target, the
encoder's work), or `input_tokens` (reasoning); output = `output_tokens`. One-turn sessions, open
loop, no shared prefixes; deterministic for a seed.
"""

from __future__ import annotations

import ast
import csv
import json
import math
from pathlib import Path

import numpy as np

from workloads.traces.session import HashPrompt, Session, Trace, TraceError, Turn

WINDOW_S = 600.0
BLOCK_SIZE = 512
"""Tokens per synthetic block (no two requests share one)."""
_INPUT_FIELDS = ("input_tokens", "text_tokens", "audio_tokens", "video_tokens")
"""Prompt tokens besides images (each image's tokens are drawn per image: `Turn.image_tokens`)."""


def _windows(path: Path) -> list[tuple[float, float, str, float, float]]:
    rows = []
    with open(path, newline="") as f:
        for line, cells in enumerate(csv.reader(f), 1):
            if len(cells) != 6:
                raise TraceError(
                    str(path),
                    line,
                    "row",
                    f"{len(cells)} columns: expected 6 (start,rate,cv,pattern,shape,scale)",
                )
            try:
                start, rate, _, pattern, shape, scale = (
                    float(cells[0]),
                    float(cells[1]),
                    cells[2],
                    cells[3],
                    float(cells[4]),
                    float(cells[5]),
                )
            except ValueError as e:
                raise TraceError(str(path), line, "row", f"{cells!r}: {e}") from None
            if rate < 0 or pattern not in ("", "Gamma", "Weibull"):
                raise TraceError(
                    str(path),
                    line,
                    "pattern",
                    f"{pattern!r} at rate {rate}: expected Gamma, Weibull or empty, rate >= 0",
                )
            rows.append((start, rate, pattern, shape, scale))
    return rows


def _pmfs(path: Path) -> dict[float, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Window start -> field -> (values, probabilities)."""
    try:
        data = json.loads(path.read_text())
        out: dict[float, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
        for start, fields in data.items():
            out[float(start)] = {}
            for name, text in fields.items():
                pmf = ast.literal_eval(text) if isinstance(text, str) else text
                values = np.array(list(pmf), dtype=float)
                p = np.array(list(pmf.values()), dtype=float)
                out[float(start)][name] = (values, p / p.sum())
        return out
    except (ValueError, SyntaxError, AttributeError) as e:
        raise TraceError(str(path), None, "dataset", f"not a map of window -> field -> PMF ({e})") from None


def _arrivals(
    rng: np.random.Generator,
    start: float,
    rate: float,
    pattern: str,
    shape: float,
    scale: float,
    lo: float,
    hi: float,
) -> list[float]:
    """Arrival times in [lo, hi) of a window from `start`: the fitted inter-arrival distribution,
    rescaled so that its mean is 1 / rate."""
    mean = shape * scale if pattern == "Gamma" else scale * math.gamma(1 + 1 / shape)
    out, t = [], start
    while t < hi:
        gaps = rng.gamma(shape, scale, 64) if pattern == "Gamma" else scale * rng.weibull(shape, 64)
        for gap in gaps / mean / rate:
            t += float(gap)
            if lo <= t < hi:
                out.append(t)
    return out


def load_servegen(
    path: str | Path,
    window_s: tuple[float, float] | None = None,
    clients: tuple[int, ...] | None = None,
    seed: int = 0,
) -> Trace:
    """Requests of `clients` (None: every client in the directory) arriving in `window_s` (None: the
    600 s window where those clients are busiest)."""
    p = Path(path)
    found = sorted(int(f.name.split("-")[1]) for f in p.glob("chunk-*-trace.csv"))
    if not found:
        raise TraceError(str(path), None, "files", "no chunk-<client>-trace.csv here")
    chosen = list(clients) if clients else found
    missing = sorted(set(chosen) - set(found))
    if missing:
        raise TraceError(str(path), None, "clients", f"{missing}: no such client here; allowed: {found}")
    windows = {c: _windows(p / f"chunk-{c}-trace.csv") for c in chosen}
    pmfs = {c: _pmfs(p / f"chunk-{c}-dataset.json") for c in chosen}
    if window_s is None:
        load: dict[float, float] = {}
        for rows in windows.values():
            for start, rate, *_ in rows:
                load[start] = load.get(start, 0.0) + rate
        busiest = max(load, key=lambda s: load[s])
        window_s = (busiest, busiest + WINDOW_S)
    rng = np.random.default_rng([seed, 11])
    sessions: list[Session] = []
    for c in chosen:
        for start, rate, pattern, shape, scale in windows[c]:
            lo, hi = max(start, window_s[0]), min(start + WINDOW_S, window_s[1])
            if rate > 0 and pattern and lo < hi:
                for t_s in _arrivals(rng, start, rate, pattern, shape, scale, lo, hi):
                    sessions.append(_request(c, t_s, pmfs[c], rng, len(sessions)))
    sessions.sort(key=lambda s: s.start_s)
    return Trace(p.name, sessions, BLOCK_SIZE)


def _request(
    client: int,
    t_s: float,
    pmfs: dict[float, dict[str, tuple[np.ndarray, np.ndarray]]],
    rng: np.random.Generator,
    i: int,
) -> Session:
    at = max(s for s in pmfs if s <= t_s % 86400.0) if any(s <= t_s % 86400.0 for s in pmfs) else min(pmfs)
    fields = pmfs[at]

    def draw(name: str) -> int:
        values, p = fields[name]
        return int(rng.choice(values, p=p))

    images: tuple[int, ...] = ()
    if "image_count" in fields and "image_tokens" in fields:  # image_tokens is per image (<= 1,280)
        images = tuple(max(1, draw("image_tokens")) for _ in range(draw("image_count")))
    num_prompt = max(1, sum(draw(f) for f in _INPUT_FIELDS if f in fields))
    max_tokens = max(1, draw("output_tokens"))
    ids = tuple(range(-(-num_prompt // BLOCK_SIZE)))
    prompt = HashPrompt(ids, num_prompt, f"servegen/{client}/{i}")
    return Session(f"client{client}-{i:06d}", [Turn(prompt, max_tokens, t_s, image_tokens=images)])
