"""Overload: `testbed serve` held at 10x the rate it sustains, with its admission limits on.

The server runs in its own process (its memory alone is sampled) on the guide's P/D design (one L40S
prefill, one decode; compute skip) with `scheduler.max_waiting` and `scheduler.max_queue_time_s`.
First its capacity is measured closed-loop (64 clients send one request after another, a second
apart after a 429: completions per second); then Poisson arrivals at ten times that capacity for
`--seconds`. Throughout, /health and /metrics are asked every half second (their worst answer time
must stay under 1 s) and the server's RSS is sampled every two seconds (bounded: it levels off
instead of growing with the requests refused). Every request gets a 200 or a 429 with Retry-After.

    python bench/overload.py [--out runs/bench-overload.json] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

PROMPT = "word " * 660  # ~2k prompt tokens (the project's tokenizer): prefill bounds the capacity
MAX_TOKENS = 128
LIMITS = ["scheduler.max_waiting=8", "scheduler.max_queue_time_s=5"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def start_server(port: int) -> subprocess.Popen[bytes]:
    sets = [a for s in ["runner.compute=skip", *LIMITS] for a in ("--set", s)]
    cmd = [sys.executable, "-m", "cluster.cli", "serve", "--preset", "guide-l40s", "--design", "pd-fast"]
    proc = subprocess.Popen([*cmd, *sets, "--port", str(port)], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the server did not start (exit code {proc.poll()})")
        time.sleep(0.5)


async def measure(base: str, pid: int, seconds: float) -> dict[str, object]:
    async with httpx.AsyncClient(base_url=base, timeout=120) as c:
        model = (await c.get("/v1/models")).json()["data"][0]["id"]
        num_sent = 0

        async def send() -> int:
            nonlocal num_sent
            num_sent += 1  # each prompt starts with its own number: no prefix is shared
            content = f"{num_sent} {PROMPT}"
            body = {
                "model": model,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": MAX_TOKENS,
            }
            return (await c.post("/v1/chat/completions", json=body)).status_code

        # Capacity, closed loop: 64 clients (more than the engines admit), each sending its next
        # request when the last is answered, or a second after a 429 (its Retry-After).
        done = 0
        stop = time.monotonic() + 30

        async def client() -> None:
            nonlocal done
            while time.monotonic() < stop:
                ok = await send() == 200  # (awaited first: `done +=` would read `done` before it)
                done += ok
                if not ok:
                    await asyncio.sleep(1.0)

        await asyncio.gather(*(client() for _ in range(64)))
        capacity = done / 30
        # 10x that, open loop, with /health, /metrics and RSS sampled as it goes.
        rate = 10 * capacity
        rng = np.random.default_rng(0)
        probes: list[float] = []
        rss: list[float] = []
        end = time.monotonic() + seconds

        async def watch() -> None:
            while time.monotonic() < end:
                for path in ("/health", "/metrics"):
                    t = time.monotonic()
                    assert (await c.get(path)).status_code == 200
                    probes.append(time.monotonic() - t)
                if len(probes) % 4 == 0:
                    rss.append(rss_mib(pid))
                await asyncio.sleep(0.5)

        watcher = asyncio.ensure_future(watch())
        sends = []
        t = time.monotonic()
        while t < end:
            t += rng.exponential(1 / rate)
            await asyncio.sleep(max(0.0, t - time.monotonic()))
            sends.append(asyncio.ensure_future(send()))
        codes = await asyncio.gather(*sends)
        await watcher
    quarter = len(rss) // 4
    return {
        "capacity_rps": round(capacity, 2),
        "offered_rps": round(len(codes) / seconds, 1),
        "seconds": seconds,
        "requests": len(codes),
        "served": codes.count(200),
        "refused_429": codes.count(429),
        "other": len(codes) - codes.count(200) - codes.count(429),
        "health_metrics_worst_s": round(max(probes), 3),
        "health_metrics_p99_s": round(float(np.percentile(probes, 99)), 3),
        "rss_mib_start": round(rss[0], 1),
        "rss_mib_after_first_quarter": round(rss[quarter], 1),
        "rss_mib_end": round(rss[-1], 1),
        "rss_mib_peak": round(max(rss), 1),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="runs/bench-overload.json")
    p.add_argument("--seconds", type=float, default=60.0)
    args = p.parse_args()
    port = free_port()
    proc = start_server(port)
    try:
        row = asyncio.run(measure(f"http://127.0.0.1:{port}", proc.pid, args.seconds))
    finally:
        proc.terminate()
        proc.wait(60)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(row, indent=2) + "\n")
    print(json.dumps(row))
    return 0 if row["other"] == 0 and row["health_metrics_worst_s"] < 1.0 else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
