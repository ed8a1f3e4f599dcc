"""The serving path around the engines: routing, the render tier, the clock, metrics."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from emulation.config.strict import STRICT

RouterPolicy = Literal["round_robin", "session_affinity", "kv_aware", "kv_estimated"]
ROUTER_POLICIES: tuple[str, ...] = typing.get_args(RouterPolicy)


@dataclass(frozen=True)
class RouterConfig:
    """How the proxy picks an engine among a pool's replicas (llm-d's and Dynamo's routers)."""

    __pydantic_config__ = STRICT

    policy: RouterPolicy = "round_robin"
    """round_robin; session_affinity: a session's turns stay on the engine its first turn went to;
    kv_aware: lowest overlap_weight x blocks to prefill + active blocks, from the engines' KV events;
    kv_estimated: the same cost from the router's own routing history (no events), entries expiring
    after estimate_ttl_s. In P/D the policy picks prefill; decode goes to the least loaded."""
    overlap_weight: Annotated[float, Field(ge=0)] = 1.0
    """Weight of the blocks an engine would have to prefill against its active blocks (Dynamo's
    --kv-overlap-score-weight; 0: pure load balancing)."""
    offload_hit_weight: Annotated[float, Field(ge=0, le=1)] = 0.8
    """kv_aware: what a prompt block an engine holds only in an offload tier (host, disk) counts for
    against one in its GPU prefix cache (1): llm-d's precise prefix scorer weighs its cpu tier 0.8."""
    temperature: Annotated[float, Field(ge=0)] = 0.0
    """0: the lowest cost wins; > 0: softmax over -cost / (max - min) / temperature (seeded)."""
    estimate_ttl_s: Annotated[float, Field(gt=0)] = 120.0
    """kv_estimated: how long a routed prompt's blocks count as cached on its engine (Dynamo: 120 s)."""
    max_prefill_retries: Annotated[int, Field(ge=0)] = 1
    """P/D: how many times a request whose prefill engine died is sent to another prefill engine
    before it fails (a dead engine is never picked again)."""
    health_check_interval_s: float | None = 5.0
    """Emulated seconds between the proxy's health checks of its engines (vLLM's /health, probed as
    llm-d's and Kubernetes' readiness probes do): one found dead leaves routing then, not only when a
    request sent to it fails. None: no checks. (Virtual mode: checks run only while engine kills are
    due; a hung engine passes them, as a wedged vLLM passes /health.)"""
    prefill_timeout_s: Annotated[float | None, Field(gt=0)] = None
    """P/D: emulated seconds the proxy waits for a prefill engine's answer (its KV descriptor); past
    it the request is aborted there, that engine is taken out of routing (as a failed health check
    would) and the request retried on another (within max_prefill_retries). None: wait for ever (a
    hung engine holds its requests). Leave room for the longest prompt's queueing and compute."""

    def policy_for(self, role: str) -> str:
        """The policy routing the pool of `role` (mixed, prefill, decode): `policy`, but decode in P/D
        under a KV policy goes to the least loaded (its prompt KV comes with the request)."""
        if role == "decode" and self.policy not in ("round_robin", "session_affinity"):
            return "least_loaded"
        return self.policy


@dataclass(frozen=True)
class RenderConfig:
    __pydantic_config__ = STRICT

    replicas: Annotated[int, Field(ge=1)] = 2
    """Render replicas (templates, detokenizing, parsing: CPU work off the GPU box)."""
    tokenizer_path: str | None = None
    """A local Hugging Face tokenizer directory; None: the project's BPE (trained once, cached)."""
    chat_template_path: str | None = None
    """A Jinja chat template file replacing the tokenizer's own."""
    derender: Literal["stateful", "stateless"] = "stateful"
    """How a stream is derendered. stateful: the replica that rendered a request keeps its decoder and
    parser, each engine batch sends only its new tokens; stateless: every batch carries the whole
    output so far to any replica, which rebuilds them and replays it (no affinity, O(N^2) work)."""
    s_per_call: Annotated[float, Field(ge=0)] = 9e-5
    """Render tier CPU seconds per request besides its tokens (template, call overhead): with
    `s_per_prompt_token`, the cost model a replayed request's `render_s` comes from (a trace holds token
    IDs, so nothing renders). Defaults measured by `bench/render_cost.py`; behind `testbed serve` every
    render is timed instead."""
    s_per_prompt_token: Annotated[float, Field(ge=0)] = 1.3e-6
    """Render tier CPU seconds per prompt token (tokenizing), for the same cost model. Both defaults:
    the project's render tier on a 2-core x86 VM, fitted over 80-33k-token chat requests (1.1-1.8 us
    per token over repeated runs); a real model's tokenizer and template cost differently: measure."""
    s_per_image: Annotated[float, Field(ge=0)] = 0.0
    """Render tier CPU seconds per image besides its pixels, for the same cost model (a replayed or
    generated request's images: `s_per_image + s_per_image_pixel x processed pixels` each, the pixels
    being its visual tokens x (patch x merge)² of the target's processor). Measured by
    `bench/render_cost.py`; behind `testbed serve` every image is timed instead."""
    s_per_image_pixel: Annotated[float, Field(ge=0)] = 5e-8
    """Render tier CPU seconds per processed image pixel (decode, normalise, cut into patches, hash).
    Both image defaults: the project's render tier on a 2-core x86 VM, Qwen3-VL's processor, JPEG
    photos of 64-3,136 visual tokens at their processed size, fitted on relative error (no fixed cost
    seen; 49-59 ns per pixel over repeated runs, ~20 ms for a 400-token image; a larger source image
    costs more to decode and resize: measure)."""


@dataclass(frozen=True)
class ClockConfig:
    __pydantic_config__ = STRICT

    mode: Literal["virtual", "live"] = "virtual"
    """virtual: one process, time jumps to the next event; live: Ray actors sleeping in wall time."""
    time_scale: Annotated[float, Field(gt=0)] | Literal["auto"] = 1.0
    """live only: wall seconds per emulated second; `auto` measures this host's real work per step
    and picks the smallest scale at which every step fits its budget."""
    stream_flush_wall_s: Annotated[float | None, Field(ge=0)] = None
    """live only: wall seconds between the batches an engine actor streams to the proxy (each batch is
    one Ray message). Tokens keep their emulated stamps, so results and metrics are exact either way,
    but a client of `serve --ray` gets each token up to this late. None: 0.05 in a replayed run, 0.01
    behind `serve --ray` (where client-side ITL is the point)."""
    max_sync_uncertainty_s: Annotated[float, Field(gt=0)] = 0.005
    """live only: each actor's clock is the head's monotonic clock through an offset measured at start
    by halving round trips (`cluster.clock_sync`); a run whose offset to some actor is known no better
    than this (wall seconds; half the fastest round trip) is refused. Each node's is in the summary."""

    @property
    def scale(self) -> float:
        """The resolved time_scale (cluster.calibrate replaces `auto` before anything runs)."""
        if self.time_scale == "auto":
            raise ValueError("clock.time_scale='auto' must be resolved by cluster.calibrate first")
        return self.time_scale


@dataclass(frozen=True)
class MetricsConfig:
    __pydantic_config__ = STRICT

    sd_file: str = "/tmp/disagg-testbed/prometheus-targets.json"
    """live: where the driver writes the Prometheus file-SD list of every actor's /metrics address
    (the path `dashboards/prometheus.yml` and `testbed dashboards up` read)."""
    linger_s: Annotated[float, Field(ge=0)] = 5.0
    """live: wall seconds the actors keep serving /metrics after the last request, so that Prometheus
    scrapes the final values (the shipped scrape interval is 5 s)."""
