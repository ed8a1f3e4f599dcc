"""The run configuration: frozen dataclasses, one per concern.

Built only through `cluster.config_load` (which validates YAML, presets and `--set` overrides at the
edge); everything inside the testbed takes these objects as given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ConfigDict

_STRICT = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class OperatorEfficiencies:
    """Fractions of peak each operator group achieves (`target.time_model: operators`). Defaults: the
    aggregate model's two, fitted to the guide's L40S low-load medians (compute: the 8k prompt's TTFT;
    bandwidth: the ITL), given to the groups they bound; nothing else is fitted."""

    __pydantic_config__ = _STRICT

    gemm_compute: float = 0.47
    """QKV/O and MLP GEMMs and the LM head, of peak FLOP/s (compute-bound: prompt chunks)."""
    attention_compute: float = 0.47
    """Prefill attention (FlashAttention-style, causal), of peak FLOP/s."""
    weights_bandwidth: float = 0.75
    """Streaming the weights (memory-bound GEMMs: decode batches), of peak memory bandwidth."""
    kv_bandwidth: float = 0.75
    """Decode attention reading each decode's KV, of peak memory bandwidth."""
    all_reduce_bandwidth: float = 0.8
    """Tensor-parallel all-reduces, of the TP link's bandwidth (an assumed bus efficiency: measure)."""


@dataclass(frozen=True)
class CpuOverhead:
    """CPU work on a step's path (`target.time_model: operators`): scheduling, preparing inputs,
    sampling, output processing, detokenising and streaming, which grow with the batch."""

    __pydantic_config__ = _STRICT

    s_per_step: float = 0.002
    """Fixed per step: the aggregate model's step overhead, fitted to the guide's low-load ITL (one or
    two running requests)."""
    s_per_request: float = 1.4e-5
    """Per running (scheduled) request: vLLM V1 measured a 5-6 ms gap between decode steps at 256
    running requests (Llama-2-7B; vllm-project/vllm#10634), (5.5 ms - 2 ms) / 256."""
    s_per_token: float = 0.0
    """Per scheduled token (input arrays, slot mapping) on the step's critical path: none by default.
    That work is vectorised and runs while the GPU finishes the previous step: an engine with vLLM-like
    batching measured 0.95 ms for a 16,255-token prefill (58 ns a token), 98.5 % of it under GPU work
    (wejoncy/sfllm#43); vLLM V1 prepares inputs the same way (numpy arrays, async scheduling). Set it
    when a profile of your server shows gaps between steps growing with the batch's tokens."""


@dataclass(frozen=True)
class TargetConfig:
    __pydantic_config__ = _STRICT

    model: str = "qwen2.5-7b"
    """Emulated model, a name from target.profiles.MODELS."""
    served_model_name: str | None = None
    """The `model_name` label of every metric (vLLM's --served-model-name); None: `model`."""
    eta_compute: float = 0.47
    """Fraction of peak FLOP/s a step achieves (fitted to the guide's L40S medians)."""
    eta_bandwidth: float = 0.75
    """Fraction of peak memory bandwidth a step achieves."""
    step_overhead_s: float = 0.002
    """Fixed per-step cost: scheduling, launch, sampling (the aggregate model's)."""
    time_model: Literal["aggregate", "operators"] = "aggregate"
    """aggregate: one roofline over the whole step, max(compute, memory) + step_overhead_s (eta_compute,
    eta_bandwidth); operators: a roofline per operator group, summed, with tensor-parallel all-reduces
    and a CPU overhead that grows with the batch (`operators`, `cpu_overhead`; target.operators)."""
    operators: OperatorEfficiencies = field(default_factory=OperatorEfficiencies)
    """The per-operator model's efficiencies."""
    cpu_overhead: CpuOverhead = field(default_factory=CpuOverhead)
    """The per-operator model's CPU work per step."""
    gpu_memory_utilization: float = 0.9
    """Share of GPU memory the engine may use for weights + KV (vLLM's flag)."""


@dataclass(frozen=True)
class PoolConfig:
    __pydantic_config__ = _STRICT

    replicas: int = 0
    """Number of engine replicas in this pool (data parallel)."""
    gpu: str = "l40s"
    """GPU of each replica, a name from target.profiles.GPUS."""
    tp: int = 1
    """Tensor-parallel degree: GPUs per replica."""


@dataclass(frozen=True)
class PoolsConfig:
    """Either `mixed` replicas (collocated) or `prefill` + `decode` replicas (P/D), not both."""

    __pydantic_config__ = _STRICT

    mixed: PoolConfig = field(default_factory=lambda: PoolConfig(replicas=1))
    prefill: PoolConfig = field(default_factory=PoolConfig)
    decode: PoolConfig = field(default_factory=PoolConfig)
    encoder: PoolConfig = field(default_factory=PoolConfig)
    """Vision-encoder replicas (E/P/D, E/PD); none: the LM engines encode images in their own steps."""

    def by_role(self) -> tuple[tuple[Literal["prefill", "decode", "mixed"], PoolConfig], ...]:
        """(role, pool) pairs, prefill first: decode engines are wired to the prefill engines."""
        return (("prefill", self.prefill), ("decode", self.decode), ("mixed", self.mixed))


@dataclass(frozen=True)
class SchedulerConfig:
    __pydantic_config__ = _STRICT

    max_num_batched_tokens: int = 2048
    """Token budget of one step, shared by decodes and prefill chunks."""
    max_num_seqs: int = 256
    """Most requests running in one engine at once."""
    block_size: int = 16
    """Tokens per KV block."""
    max_model_len: int = 32768
    """Most tokens (prompt + max_tokens) one request may have; longer requests are rejected."""
    enable_prefix_caching: bool = True
    """Reuse cached KV blocks keyed by chained block hashes."""
    num_gpu_blocks_override: int | None = None
    """Fix the KV capacity in blocks instead of deriving it from GPU memory (for tests of KV pressure)."""
    max_waiting: int | None = None
    """Admission limit: a request that finds this many waiting to be scheduled is rejected at once
    (finished_reason `rejected`; HTTP 429 with Retry-After) instead of queueing without bound.
    None: no limit (vLLM's behaviour)."""
    max_num_batched_encoder_embeds: int | None = None
    """Visual tokens the vision encoder may produce in one step (vLLM's name; None: as many as
    max_num_batched_tokens). An image that does not fit waits for a later step, its prompt chunk cut
    before it; one larger than the budget runs alone."""
    encoder_cache_size: int | None = None
    """Embeddings the engine's encoder cache holds (None: the encoder budget, as vLLM sizes it)."""

    @property
    def encoder_budget(self) -> int:
        """`max_num_batched_encoder_embeds`, its default resolved."""
        return self.max_num_batched_encoder_embeds or self.max_num_batched_tokens

    @property
    def encoder_cache_embeds(self) -> int:
        """`encoder_cache_size`, its default resolved."""
        return self.encoder_cache_size or self.encoder_budget


@dataclass(frozen=True)
class ECTransferConfig:
    """Moving image embeddings from the encoder pool to prefill (vLLM's EC connector)."""

    __pydantic_config__ = _STRICT

    link: str = "rdma-400g"
    """Link between encoder and prefill engines, a name from target.profiles.LINKS."""


@dataclass(frozen=True)
class KVTransferConfig:
    __pydantic_config__ = _STRICT

    link: str = "pcie4-x16"
    """Link between prefill and decode engines, a name from target.profiles.LINKS."""
    mode: Literal["pull", "push"] = "pull"
    """pull: decode reads the KV once it has the request and notices completion at its next step
    boundary (vLLM's NIXL connector); push: decode gets the request first and reserves blocks, prefill
    sends into them once it has finished and they exist (decode-first), and decode is notified."""
    layerwise: bool = False
    """push only: stream each layer's KV while the next computes, hiding the transfer under the
    request's own prefill compute that ran after decode's blocks existed."""
    link_scope: Literal["prefill", "fabric"] = "prefill"
    """Which transfers share a link's wire. prefill: each prefill engine's own egress (every pull from
    it queues there, whichever decode engine started it); fabric: one link for the whole deployment (a
    shared switch or PCIe root), every transfer queues on it."""
    hold_timeout_s: float = 120.0
    """Prefill side: release a finished request's KV if no decode engine pulled it within this time."""
    bidirectional: bool = False
    """pull only: decode keeps a finished turn's blocks (prompt and answer) for the conversation's next
    turn, and prefill pulls back the blocks of them it lacks instead of computing them again (vLLM's
    NixlConnector bidirectional mode; conversations are the replayed sessions)."""
    decoder_kv_blocks_ttl_s: float = 480.0
    """bidirectional: how long decode keeps a conversation's blocks waiting for its next turn."""
    load_failure_policy: Literal["recompute", "fail"] = "fail"
    """A decode engine's failed KV load (vLLM's `kv_load_failure_policy`). fail: the request ends with
    an error (vLLM's default); recompute: it computes its prompt here instead (a pull back always
    does)."""
    reuse: Literal["verified", "positional"] = "verified"
    """bidirectional: which of decode's blocks prefill takes. verified: the leading blocks whose chained
    hashes match its own prompt's (the prefix cache's rule; stops at the first difference);
    positional: decode's blocks by position, as if the new prompt began with decode's sequence (what
    vLLM issue #43094 describes: wrong KV when the template or harness edited the history)."""


@dataclass(frozen=True)
class RunnerConfig:
    __pydantic_config__ = _STRICT

    compute: Literal["real", "skip"] = "real"
    """real: the runner model computes every scheduled token; skip: timing only."""
    model_path: str | None = None
    """Local Hugging Face model directory; None builds (once) the seeded tiny Qwen2 model in the cache."""
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    vocab_size: int = 8192
    weights_seed: int = 0
    """Seed of the tiny model's weights (part of its cache key)."""
    num_threads: int = 1
    """torch threads per engine; one keeps co-located engines from stealing each other's cores."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the runner computes; auto: a GPU when the process sees one, else the CPU."""
    num_gpus: float = 0.0
    """live only: share of a GPU each engine actor asks Ray for (e.g. 0.25 packs four per GPU)."""
    macro_steps: bool = True
    """virtual mode with compute skip: emulate a steady stretch of steps (every running request
    decoding, perhaps one computing its prompt in chunks; nothing arriving, finishing or running short
    of blocks before its end) as one event, and hand each request's tokens to its client at its end,
    with the stamps, tokens, counters and metrics of a step at a time; false runs every step as its own
    event and streams every token (to compare)."""


@dataclass(frozen=True)
class ClockConfig:
    __pydantic_config__ = _STRICT

    mode: Literal["virtual", "live"] = "virtual"
    """virtual: one process, time jumps to the next event; live: Ray actors sleeping in wall time."""
    time_scale: float | Literal["auto"] = 1.0
    """live only: wall seconds per emulated second; `auto` measures this host's real work per step
    and picks the smallest scale at which every step fits its budget."""
    stream_flush_wall_s: float | None = None
    """live only: wall seconds between the batches an engine actor streams to the proxy (each batch is
    one Ray message). Tokens keep their emulated stamps, so results and metrics are exact either way,
    but a client of `serve --ray` gets each token up to this late. None: 0.05 in a replayed run, 0.01
    behind `serve --ray` (where client-side ITL is the point)."""

    @property
    def scale(self) -> float:
        """The resolved time_scale (cluster.calibrate replaces `auto` before anything runs)."""
        if self.time_scale == "auto":
            raise ValueError("clock.time_scale='auto' must be resolved by cluster.calibrate first")
        return self.time_scale


@dataclass(frozen=True)
class WorkloadConfig:
    __pydantic_config__ = _STRICT

    kind: Literal["synthetic", "trace", "multi_turn"] = "synthetic"
    """synthetic: random prompts of fixed lengths (the guide's `vllm bench serve --dataset random`);
    trace: the sessions of `replay.trace`; multi_turn: conversations as `multi_turn` describes them
    (the fields below apply to synthetic only)."""
    rate: float = 0.2
    """Offered load, requests per emulated second (Poisson arrivals)."""
    num_requests: int = 100
    prompt_len: int = 8192
    """Prompt tokens per request."""
    output_len: int = 256
    """Output tokens per request (max_tokens, EOS ignored)."""
    output_policy: Literal["forced", "greedy"] = "forced"
    """forced: emit the workload's answer tokens; greedy: argmax of the runner's real logits."""
    images_per_request: str = "constant:0"
    """Images in each request's prompt, a distribution (`constant:4`, `uniform:1:4`; see
    multi_turn): each adds its visual tokens to prompt_len's text. Needs a vision-language target."""
    image_tokens: int = 400
    """Visual tokens per image (a square grid: 400 is 20 x 20 tokens, 40 x 40 patches, a 560-pixel
    image in Qwen2.5-VL's processor)."""
    text_only_fraction: float = 0.0
    """Share of requests without images."""
    image_reuse: float = 0.0
    """Chance that an image is one an earlier request sent (the same hash: encoder cache hits)."""


@dataclass(frozen=True)
class MultiTurnConfig:
    """Synthetic conversations (workload.kind=multi_turn), in the shape of vLLM's
    benchmarks/multi_turn generator; lengths are distributions (`constant:N`, `uniform:LO:HI`,
    `lognormal:MEAN:SIGMA`, `zipf:A`, `poisson:MEAN`, each optionally `:max=M`). The defaults are
    vLLM's example; `testbed replay --scenario six-turn` is 6 turns of 3,600 + 400 then 600 / 400."""

    __pydantic_config__ = _STRICT

    num_conversations: int = 32
    num_turns: str = "uniform:6:9"
    """Turns per conversation (user messages, each answered)."""
    common_prefix_tokens: int = 500
    """A prefix every conversation's first prompt starts with (a shared system prompt)."""
    prefix_tokens: str = "lognormal:1000:0.5:max=5000"
    """Each conversation's own prefix on its first turn (a document, a task)."""
    user_tokens: str = "uniform:120:160"
    """Each user message."""
    output_tokens: str = "uniform:80:120"
    """Each answer (max_tokens; EOS ignored)."""
    think_s: str = "constant:0"
    """Seconds between an answer and the next user message."""
    conversation_rate: float = 1.0
    """New conversations per second (Poisson)."""
    history: Literal["generated", "model"] = "generated"
    """generated: each turn's prompt repeats the generator's own answers (forced answers match it);
    model: it repeats the answers the model actually gave (greedy: real logits), so a wrong KV reuse
    changes every later turn."""
    strip_answer_tokens: int = 0
    """history=model: leave each answer's first N tokens out of the history (a template dropping past
    reasoning: the next prompt is no longer a prefix of what decode generated)."""
    rewrite_answer_tokens: int = 0
    """history=model: replace each answer's last N tokens in the history by others of the same count
    (an agent harness re-serialising the tool call an answer ends with: same length, other tokens)."""


@dataclass(frozen=True)
class ReplayConfig:
    """How a trace is replayed (workload.kind=trace)."""

    __pydantic_config__ = _STRICT

    trace: str | None = None
    """The trace: a file, or a directory of WEKA session files."""
    format: Literal["auto", "mooncake", "azure", "weka", "swe-agent", "servegen"] = "auto"
    """auto: from the name (`.traj.json` or a directory of them: swe-agent; a directory of
    `chunk-*-trace.csv`: servegen; `.jsonl`: mooncake; `.csv`: azure; `.json` or a directory: weka),
    else from the first line."""
    clients: tuple[int, ...] | None = None
    """servegen: the clients (chunk ids) to sample; None: all of the directory's."""
    timing: Literal["think", "original", "api-scaled"] = "think"
    """When a session's next turn goes, after the previous one finished. think: its think time;
    original: at its trace time if later; api-scaled: the previous send + its API time x
    api_time_scale + think time, if later. One-turn sessions always go at their timestamps."""
    speedup: float = 1.0
    """Divides every trace time and delay (2: twice the offered load)."""
    api_time_scale: float = 1.0
    """api-scaled timing: the share of each original call's duration kept between sends."""
    window_s: tuple[float, float] | None = None
    """Replay only sessions starting in [start, end) trace seconds, shifted to start at 0 (servegen:
    sample arrivals in it; None there: the chosen clients' busiest 600 s)."""
    max_turns: int | None = None
    """Replay at most each session's first N turns (vLLM's multi-turn benchmark: --max-turns)."""
    max_sessions: int | None = None
    """Most top-level sessions running at once (a closed-loop user count); None: no cap."""
    session_salt: bool = False
    """Give each session private blocks (no prefix shared across sessions), as one replayed user per
    trace session on a shared server would have."""
    history: Literal["trace", "model"] = "trace"
    """Chat traces: trace: each turn sends the trace's messages; model: each turn sends the messages the
    conversation really had, the answer the server gave (content, reasoning, tool calls) in place of
    the trace's, then the messages the trace adds after it (an agent harness's loop; `--target`)."""
    harness_edit: Literal["none", "reserialize_tool_calls"] = "none"
    """history=model: how the harness changes an answer before sending it back. reserialize_tool_calls:
    every tool call's arguments parsed and dumped compact (`{"a":1}` for `{"a": 1}`), as harnesses that
    keep calls as objects do: the next prompt is no longer a prefix of what decode generated."""
    tools: tuple[dict[str, Any], ...] | None = None
    """OpenAI tool definitions sent with every chat request (an agent acting through function calls:
    the server's answers then call them, and harness_edit has calls to re-serialise)."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Sent with every chat request (vLLM's extension), e.g. `{keep_past_reasoning: true}` (the testbed's
    template) or `{enable_thinking: false}`."""


@dataclass(frozen=True)
class RouterConfig:
    """How the proxy picks an engine among a pool's replicas (llm-d's and Dynamo's routers)."""

    __pydantic_config__ = _STRICT

    policy: Literal["round_robin", "session_affinity", "kv_aware", "kv_estimated"] = "round_robin"
    """round_robin; session_affinity: a session's turns stay on the engine its first turn went to;
    kv_aware: lowest overlap_weight x blocks to prefill + active blocks, from the engines' KV events;
    kv_estimated: the same cost from the router's own routing history (no events), entries expiring
    after estimate_ttl_s. In P/D the policy picks prefill; decode goes to the least loaded."""
    overlap_weight: float = 1.0
    """Weight of the blocks an engine would have to prefill against its active blocks (Dynamo's
    --kv-overlap-score-weight; 0: pure load balancing)."""
    temperature: float = 0.0
    """0: the lowest cost wins; > 0: softmax over -cost / (max - min) / temperature (seeded)."""
    estimate_ttl_s: float = 120.0
    """kv_estimated: how long a routed prompt's blocks count as cached on its engine (Dynamo: 120 s)."""
    max_prefill_retries: int = 1
    """P/D: how many times a request whose prefill engine died is sent to another prefill engine
    before it fails (a dead engine is never picked again)."""


@dataclass(frozen=True)
class RenderConfig:
    __pydantic_config__ = _STRICT

    replicas: int = 2
    """Render replicas (templates, detokenizing, parsing: CPU work off the GPU box)."""
    tokenizer_path: str | None = None
    """A local Hugging Face tokenizer directory; None: the project's BPE (trained once, cached)."""
    chat_template_path: str | None = None
    """A Jinja chat template file replacing the tokenizer's own."""
    derender: Literal["stateful", "stateless"] = "stateful"
    """How a stream is derendered. stateful: the replica that rendered a request keeps its decoder and
    parser, each engine batch sends only its new tokens; stateless: every batch carries the whole
    output so far to any replica, which rebuilds them and replays it (no affinity, O(N^2) work)."""
    s_per_call: float = 9e-5
    """Render tier CPU seconds per request besides its tokens (template, call overhead): with
    `s_per_prompt_token`, the cost model a replayed request's `render_s` comes from (a trace holds token
    IDs, so nothing renders). Defaults measured by `bench/render_cost.py`; behind `testbed serve` every
    render is timed instead."""
    s_per_prompt_token: float = 1.3e-6
    """Render tier CPU seconds per prompt token (tokenizing), for the same cost model. Both defaults:
    the project's render tier on a 2-core x86 VM, fitted over 80-33k-token chat requests (1.1-1.8 us
    per token over repeated runs); a real model's tokenizer and template cost differently: measure."""
    s_per_image: float = 0.0
    """Render tier CPU seconds per image besides its pixels, for the same cost model (a replayed or
    generated request's images: `s_per_image + s_per_image_pixel x processed pixels` each, the pixels
    being its visual tokens x (patch x merge)² of the target's processor). Measured by
    `bench/render_cost.py`; behind `testbed serve` every image is timed instead."""
    s_per_image_pixel: float = 5e-8
    """Render tier CPU seconds per processed image pixel (decode, normalise, cut into patches, hash).
    Both image defaults: the project's render tier on a 2-core x86 VM, Qwen3-VL's processor, JPEG
    photos of 64-3,136 visual tokens at their processed size, fitted on relative error (no fixed cost
    seen; 49-59 ns per pixel over repeated runs, ~20 ms for a 400-token image; a larger source image
    costs more to decode and resize: measure)."""


@dataclass(frozen=True)
class EngineKill:
    __pydantic_config__ = _STRICT

    engine: str
    """The engine to kill: its id, `<role>-<replica>` (prefill-0, decode-1, mixed-0)."""
    at_s: float
    """Emulated seconds from the run's start."""


@dataclass(frozen=True)
class LinkSlowdown:
    __pydantic_config__ = _STRICT

    start_s: float
    end_s: float
    """The emulated window [start_s, end_s) in which KV transfers start slowed."""
    bandwidth_factor: float
    """The link's bandwidth times this (0.1: a tenth of it) for those transfers."""


@dataclass(frozen=True)
class FaultsConfig:
    """Faults injected on purpose (all off by default); deterministic for a seed in virtual mode."""

    __pydantic_config__ = _STRICT

    kv_transfer_failure_rate: float = 0.0
    """Each KV load into a decode (or pull-back prefill) engine fails with this probability, drawn from
    the run's seed and the engine's id. A failed load takes its transfer's time, then fails."""
    kv_transfer_failures: tuple[int, ...] = ()
    """Also fail these loads (1-based, counted per receiving engine): `[1, 5]` fails each engine's
    first and fifth."""
    link_slowdowns: tuple[LinkSlowdown, ...] = ()
    """KV links slowed in emulated windows (several make a flapping link): a transfer that starts in
    one moves its bytes at `bandwidth_factor` of the link's bandwidth (latency and fixed costs as
    they are)."""
    engine_kills: tuple[EngineKill, ...] = ()
    """Engines killed at an emulated time: their requests fail (or, a prefill engine's, are retried
    elsewhere by the proxy), later calls to them fail as a dead actor's do. Live: the actor is killed."""


@dataclass(frozen=True)
class MetricsConfig:
    __pydantic_config__ = _STRICT

    sd_file: str = "/tmp/disagg-testbed/prometheus-targets.json"
    """live: where the driver writes the Prometheus file-SD list of every actor's /metrics address
    (the path `dashboards/prometheus.yml` and `testbed dashboards up` read)."""
    linger_s: float = 5.0
    """live: wall seconds the actors keep serving /metrics after the last request, so that Prometheus
    scrapes the final values (the shipped scrape interval is 5 s)."""


@dataclass(frozen=True)
class TestbedConfig:
    """One design under one workload: everything a run needs."""

    __pydantic_config__ = _STRICT
    __test__ = False  # not a pytest class

    design: str = "default"
    """Name of the design (a preset's key), carried into results."""
    target: TargetConfig = field(default_factory=TargetConfig)
    pools: PoolsConfig = field(default_factory=PoolsConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_transfer: KVTransferConfig = field(default_factory=KVTransferConfig)
    ec_transfer: ECTransferConfig = field(default_factory=ECTransferConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    clock: ClockConfig = field(default_factory=ClockConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    render: RenderConfig = field(default_factory=RenderConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    slos: tuple[str, ...] = ("ttft<=2s,tpot<=30ms", "ttft<=2s,gap<=100ms")
    """SLO sets: comma-joined `metric<=value` terms over ttft, tpot, itl (per-request p99), gap, e2el."""
    seed: int = 0
    """Seeds arrivals, prompts and forced answers."""
