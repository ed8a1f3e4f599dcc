"""The engines: their pools, scheduler and runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from emulation.config.afd import AfdConfig
from emulation.config.strict import STRICT


def replica_id(role: str, replica: int) -> str:
    """The id a role's replica goes by everywhere (`prefill-0`, `encoder-1`, `render-0`): results' engine
    columns, fault targets, metrics' `actor` label, Prometheus targets."""
    return f"{role}-{replica}"


@dataclass(frozen=True)
class PoolConfig:
    __pydantic_config__ = STRICT

    replicas: Annotated[int, Field(ge=0)] = 0
    """Number of engine replicas in this pool (data parallel)."""
    gpu: str = "l40s"
    """GPU of each replica, a name from emulation.profiles.GPUS."""
    tp: Annotated[int, Field(ge=1)] = 1
    """Tensor-parallel degree: GPUs per replica (per expert-parallel rank when ep > 1)."""
    ep: Annotated[int, Field(ge=1)] = 1
    """Expert-parallel ranks per replica, mixture-of-experts targets only; each rank is `tp` GPUs, so a
    replica spans ep x tp GPUs. The routed experts are sharded over the ranks (num_experts / ep each,
    each expert's matrices split tp ways inside its rank), and every MoE layer sends each token to the
    ranks of its experts and back (dispatch and combine, two all-to-alls over target.ep_fabric).
    vLLM's `--enable-expert-parallel` with TP 8 is ep=8, tp=1; with DP 8 add dp_attention."""
    dp_attention: bool = False
    """With ep > 1: each EP rank runs attention over its own requests (data-parallel attention, TP `tp`
    inside the rank; a request's KV on one rank only), as DeepSeek's, SGLang's and llm-d's wide-EP
    deployments do (vLLM's `--data-parallel-size ep`). The replica is one engine whose scheduler
    holds ep ranks' worth of sequences, tokens and KV blocks, its requests spread evenly over the
    ranks. False: attention is tensor-parallel over all ep x tp GPUs."""
    num_redundant_experts: Annotated[int, Field(ge=0)] = 0
    """Extra expert replicas spread over the EP ranks (vLLM's EPLB `num_redundant_experts`): the
    hottest experts get a second copy on the least loaded ranks, splitting their tokens; each copy
    costs its weights' memory."""
    enable_dbo: bool = False
    """Dual-batch overlap (vLLM's `--enable-dbo`): each step runs as two micro-batches, one's
    all-to-alls under the other's compute; the weights are read once per micro-batch."""
    afd: AfdConfig | None = None
    """Attention-FFN disaggregation, mixture-of-experts targets only: each replica is attention ranks
    of `tp` GPUs (the engine) and FFN ranks holding the experts (`AfdConfig`); ep, dp_attention,
    num_redundant_experts and enable_dbo stay at their defaults (the FFN side's own fields say how
    the experts are laid out). None: attention and experts on the same GPUs."""

    @property
    def num_gpus(self) -> int:
        """GPUs of one replica: ep ranks of tp each (AFD: its attention ranks' and FFN ranks')."""
        if self.afd is not None:
            afd = self.afd
            return afd.num_attention_ranks * self.tp + afd.num_ffn_ranks * afd.ffn_gpus_per_rank
        return self.ep * self.tp

    @property
    def num_attention_ranks(self) -> int:
        """Data-parallel attention ranks of one replica (1 unless dp_attention or AFD)."""
        if self.afd is not None:
            return self.afd.num_attention_ranks
        return self.ep if self.dp_attention else 1

    @property
    def attention_tp(self) -> int:
        """GPUs that split one request's attention (and the dense layers) tensor-parallel."""
        return self.tp if self.dp_attention or self.afd is not None else self.ep * self.tp


@dataclass(frozen=True)
class PoolsConfig:
    """Either `mixed` replicas (collocated) or `prefill` + `decode` replicas (P/D), not both."""

    __pydantic_config__ = STRICT

    mixed: PoolConfig = field(default_factory=lambda: PoolConfig(replicas=1))
    prefill: PoolConfig = field(default_factory=PoolConfig)
    decode: PoolConfig = field(default_factory=PoolConfig)
    encoder: PoolConfig = field(default_factory=PoolConfig)
    """Vision-encoder replicas (E/P/D, E/PD); none: the LM engines encode images in their own steps."""

    def by_role(self) -> tuple[tuple[Literal["prefill", "decode", "mixed"], PoolConfig], ...]:
        """(role, pool) pairs, prefill first: decode engines are wired to the prefill engines."""
        return (("prefill", self.prefill), ("decode", self.decode), ("mixed", self.mixed))

    @property
    def gpus(self) -> dict[str, int]:
        """GPU name -> GPUs the pools take: each pool's replicas x its GPUs a replica (`PoolConfig.num_gpus`:
        ep x tp, or AFD's attention and FFN ranks), the encoder pool's among them."""
        out: dict[str, int] = {}
        for pool in (self.prefill, self.decode, self.mixed, self.encoder):
            if pool.replicas:
                out[pool.gpu] = out.get(pool.gpu, 0) + pool.replicas * pool.num_gpus
        return out

    @property
    def num_gpus(self) -> int:
        """Every GPU the pools take (`gpus`)."""
        return sum(self.gpus.values())

    def engine_ids(self) -> list[str]:
        """Every LM engine's id (`replica_id`), in `by_role` order."""
        return [replica_id(role, i) for role, pool in self.by_role() for i in range(pool.replicas)]


@dataclass(frozen=True)
class SchedulerConfig:
    __pydantic_config__ = STRICT

    max_num_batched_tokens: int = 2048
    """Token budget of one step, shared by decodes and prefill chunks."""
    max_num_seqs: Annotated[int, Field(ge=1)] = 256
    """Most requests running in one engine at once."""
    block_size: Annotated[int, Field(gt=0)] = 16
    """Tokens per KV block."""
    max_model_len: int = 32768
    """Most tokens (prompt + max_tokens) one request may have; longer requests are rejected."""
    enable_prefix_caching: bool = True
    """Reuse cached KV blocks keyed by chained block hashes."""
    num_gpu_blocks_override: Annotated[int | None, Field(gt=1)] = None
    """Fix the KV capacity in blocks instead of deriving it from GPU memory (for tests of KV pressure);
    as vLLM counts it, one of them the null block no request gets."""
    long_prefill_token_threshold: Annotated[int, Field(ge=0)] = 0
    """The most tokens one request computes in a step (vLLM's name): a longer prompt runs in chunks
    of it even when the budget has room. 0: no limit but the budget (vLLM's default). With data-parallel
    attention each rank's budget is one: a request runs on one rank."""
    reserve_full_isl: bool = True
    """Admit a waiting request only if its whole sequence (prompt, and output so far if it was
    preempted) fits in the free KV blocks, not just its first chunk (vLLM's
    `scheduler_reserve_full_isl`, on by default since 0.32: fewer admissions, less preemption)."""
    max_num_queued_reqs: Annotated[int | None, Field(ge=0)] = None
    """vLLM's limit on requests in flight in one engine (waiting, running, or loading remote KV): a
    request that would take them past it is refused on arrival (finished_reason `rejected`; HTTP 503,
    vLLM's body; counted in `vllm:admission_rejections{reason="max_num_queued_reqs"}`). None: no
    limit (vLLM's default)."""
    max_num_queued_tokens: Annotated[int | None, Field(ge=0)] = None
    """vLLM's limit on the prompt tokens of an engine's requests still in prefill (in flight, no output
    token yet; each counts its whole prompt, cached or computed): a request arriving when they reach it
    is refused (`rejected`; HTTP 503; `reason="max_num_queued_tokens"`). None: no limit (vLLM's)."""
    max_waiting: Annotated[int | None, Field(ge=1)] = None
    """A gateway's load shedding, in front of the engine (not vLLM's): a request that finds this many
    waiting to be scheduled is rejected at once (finished_reason `rejected`; HTTP 429 with
    Retry-After; `reason="max_waiting"`) instead of queueing. None: no limit."""
    max_queue_time_s: Annotated[float | None, Field(gt=0)] = None
    """A gateway's queue-time budget (not vLLM's): a request still waiting for its first step this many
    emulated seconds after it was queued is rejected then (finished_reason `rejected`, HTTP 429)
    instead of waiting on (a request whose KV is loading, or preempted after it ran, is not). None: no
    budget."""
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


def _check_layer_pattern(pattern: str) -> str:
    if not pattern or set(pattern) - set("M*E-"):
        raise ValueError("one character a layer, at least one: M (Mamba2), * (attention), E (MoE), - (MLP)")
    return pattern


@dataclass(frozen=True)
class RunnerConfig:
    __pydantic_config__ = STRICT

    compute: Literal["auto", "real", "skip"] = "auto"
    """real: the runner model computes every scheduled token (real logits and KV); skip: timing only
    (the same emulated times, at a fraction of the wall time); auto (resolved when the config is built):
    real where the numerics are read (workload.output_policy=greedy: tokens are the argmax of the
    runner's logits, and P/D's are checked against collocated's), skip otherwise."""
    model_path: str | None = None
    """Local Hugging Face model directory; None builds (once) the seeded tiny model of `architecture`
    in the cache."""
    hidden_size: Annotated[int, Field(ge=1)] = 64
    num_layers: Annotated[int, Field(ge=1)] = 2
    """Decoder layers of the tiny model (nemotron_h: not read; its layers are hybrid_override_pattern's)."""
    num_heads: Annotated[int, Field(ge=1)] = 4
    num_kv_heads: Annotated[int, Field(ge=1)] = 2
    intermediate_size: Annotated[int, Field(ge=1)] = 256
    vocab_size: Annotated[int, Field(ge=1)] = 8192
    architecture: Literal["qwen2", "qwen3_moe", "nemotron_h"] = "qwen2"
    """The tiny model's architecture (built when model_path is None): qwen2 (dense), qwen3_moe
    (transformers' Qwen3-MoE: every layer a sparse MoE block of num_experts experts, top
    num_experts_per_tok), or nemotron_h (transformers' Nemotron-H: a hybrid of Mamba2, attention, MoE
    and MLP layers in the order hybrid_override_pattern gives; attention without a rotary embedding)."""
    num_experts: Annotated[int, Field(ge=1)] = 8
    """qwen3_moe, nemotron_h: routed experts per MoE layer (nemotron_h: at least 2, its router scores
    a group by its top two)."""
    num_experts_per_tok: Annotated[int, Field(ge=1)] = 2
    """qwen3_moe, nemotron_h: experts each token is routed to (top-k)."""
    moe_intermediate_size: Annotated[int, Field(ge=1)] = 64
    """qwen3_moe, nemotron_h: each expert's MLP width (nemotron_h: its one shared expert's too)."""
    hybrid_override_pattern: Annotated[str, AfterValidator(_check_layer_pattern)] = "M*ME-M*"
    """nemotron_h: its layers, one character each, in order: M a Mamba2 mixer, * attention, E a MoE
    block, - a dense MLP (the name and letters of Nemotron-H's config.json). Its length is the number
    of layers (num_layers is not read)."""
    mamba_num_heads: Annotated[int, Field(ge=1)] = 8
    """nemotron_h: heads of each Mamba2 mixer (a multiple of n_groups)."""
    mamba_head_dim: Annotated[int, Field(ge=1)] = 16
    """nemotron_h: each Mamba2 head's width; the mixer's inner width is mamba_num_heads x this."""
    n_groups: Annotated[int, Field(ge=1)] = 2
    """nemotron_h: groups of heads sharing one B and C projection in a Mamba2 mixer (its gated norm
    normalises per group too)."""
    ssm_state_size: Annotated[int, Field(ge=1)] = 16
    """nemotron_h: each Mamba2 head's recurrent state width (the state is head_dim x this per head)."""
    conv_kernel: Annotated[int, Field(ge=2)] = 4
    """nemotron_h: the Mamba2 causal convolution's width; a request's conv state keeps the last
    conv_kernel - 1 inputs."""
    chunk_size: Annotated[int, Field(ge=1)] = 8
    """nemotron_h: tokens per chunk of the Mamba2 chunked scan in a prefill (numerics only: any chunking
    computes the same state, to rounding)."""
    weights_seed: int = 0
    """Seed of the tiny model's weights (part of its cache key)."""
    num_threads: Annotated[int, Field(ge=1)] = 1
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
