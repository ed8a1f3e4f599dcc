"""Building an engine: the one place that turns a config into an `EngineCore` and its collaborators.

Every composition root (virtual, live actors, serve) builds engines here, so an engine is wired the
same way wherever it runs::

    EngineCore ─┬─ Scheduler ── KVCacheCoordinator    (what runs each step; paged KV, prefix cache)
                ├─ Executor ── ModelRunner | None      (real compute, or none with compute skip)
                ├─ PDConnectorScheduler ── KVReceiver   (what to load/save, and when it moves)
                ├─ PDConnectorWorker ── peers           (moving it)
                ├─ EngineStats ── EngineMetrics         (counters of its report; Prometheus series)
                └─ Clock, Roofline                      (when each step ends)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from actors.encoder.encoder import EncoderCore
from actors.encoding import EncoderClient, EncoderPool
from actors.engine.clock import Clock
from actors.engine.core import EngineCore, Role
from actors.engine.kv_cache.coordinator import KVCacheCoordinator
from actors.engine.kv_cache.mamba_state import MambaStateSpec
from actors.engine.kv_cache.manager import KVCacheSpec
from actors.engine.kv_cache.sliding_window import SlidingWindowSpec
from actors.engine.kv_connectors.faults import KVLoadFaults
from actors.engine.kv_connectors.offloading import OffloadingConnector
from actors.engine.kv_connectors.pd_scheduler import PDConnectorScheduler
from actors.engine.kv_connectors.pd_worker import KVSource, PDConnectorWorker
from actors.engine.kv_connectors.shared_tier import KVStoreClient, SharedKVTier
from actors.engine.kv_connectors.tier import KVTier, Tier, TierPath
from actors.engine.kv_connectors.transfer import KVReceiver, Link, LinkQueue
from actors.engine.runner.executor import Executor
from actors.engine.scheduling.admission import Admission
from actors.engine.scheduling.encoder_cache import EncoderCache
from actors.engine.scheduling.scheduler import KVLookup, Scheduler
from actors.engine.stats import EngineStats
from actors.engine.step_clock import StepClock
from dashboards.recorders import EncoderMetrics, EngineMetrics
from emulation.config import PoolConfig, TestbedConfig, replica_id
from emulation.kv_cache import block_bytes, num_gpu_blocks, num_usable_blocks
from emulation.profiles import GPUS, LINKS, ModelProfile
from emulation.time_model import StepTimeModel, time_model_for
from emulation.vision import encoder_roofline_for, vision_encoder_of
from workloads.replay import Workload, needs_render

if TYPE_CHECKING:  # torch loads only where a runner computes (compute skip engines stay light)
    from actors.engine.runner.ffn_client import FfnRanks
    from actors.engine.runner.model_runner import ModelRunner


def runner_for(cfg: TestbedConfig, pool: PoolConfig, ffn: FfnRanks | None = None) -> ModelRunner | None:
    """The model runner of one replica of `pool`, or None with compute skip (then torch never loads).
    With `pool.afd` its sparse MoE blocks run on the replica's FFN ranks: `ffn` (live: its actors), by
    default F workers in this process (`ffn_workers`)."""
    if cfg.runner.compute != "real":
        return None
    from actors.engine.runner.ffn_client import AfdConnector
    from actors.engine.runner.model_runner import ModelRunner
    from actors.engine.runner.tiny_model import load_model

    r = cfg.runner
    if r.architecture == "nemotron_h":
        from actors.engine.runner.hybrid import HybridRunner

        blocks = num_gpu_blocks(cfg, pool)
        return HybridRunner(load_model(r), num_blocks=blocks, block_size=cfg.scheduler.block_size,
                            num_threads=r.num_threads)  # fmt: skip
    connector = None
    if pool.afd is not None:
        ranks = ffn if ffn is not None else ffn_workers(cfg, pool.afd.num_ffn_ranks)
        connector = AfdConnector(ranks, pool.afd.num_attention_ranks)
    return ModelRunner(
        load_model(r),
        num_blocks=num_gpu_blocks(cfg, pool),
        block_size=cfg.scheduler.block_size,
        num_threads=r.num_threads,
        ffn=connector,
    )


def ffn_workers(cfg: TestbedConfig, num_ffn_ranks: int) -> FfnRanks:
    """An AFD replica's FFN ranks in this process: each holds the MoE blocks of the runner's checkpoint,
    loaded from it apart from the engine's model (once per process, shared by the ranks)."""
    from actors.engine.runner.tiny_model import ensure_model, runner_device
    from actors.ffn.worker import FfnWorker, LocalFfnRanks

    path, device = str(ensure_model(cfg.runner)), runner_device(cfg.runner)
    return LocalFfnRanks([FfnWorker.load(path, device) for _ in range(num_ffn_ranks)])


def vision_for(cfg: TestbedConfig) -> Any:
    """The tiny vision encoder the runner's engines compute images with (loaded once per process), or
    None for a text-only target."""
    from actors.engine.runner.vision import load_vision_model

    vit = vision_encoder_of(cfg.target.model)
    return None if vit is None else load_vision_model(cfg.runner, vit.patch_size)


def kv_cache_specs(
    model: ModelProfile, max_num_batched_tokens: int, max_prefill_tokens: int
) -> list[KVCacheSpec]:
    """The kinds of KV cache `model` has beside full attention (a hybrid's SSM states, sliding-window
    layers), each with what its manager needs: an engine's step budget, and the most tokens a step
    gives one request."""
    groups, specs = model.kv_cache_groups, list[KVCacheSpec]()
    if model.ssm is not None:
        specs.append(
            MambaStateSpec(groups.num_state_groups, model.ssm.exports_prefill_checkpoint, max_prefill_tokens)
        )
    if model.sliding_window is not None and groups.num_sliding_groups:
        specs.append(
            SlidingWindowSpec(model.sliding_window, groups.num_sliding_groups, max_num_batched_tokens)
        )
    return specs


def kv_cache_for(cfg: TestbedConfig, pool: PoolConfig, role: Role) -> KVCacheCoordinator:
    """The KV cache of one replica of `role`'s `pool`: its blocks, a manager per kind of KV the target
    has (`kv_cache_specs`), publishing KV events where a KV-aware router reads them."""
    s, model = cfg.scheduler, cfg.target.profile
    ranks = pool.num_attention_ranks  # data-parallel attention: one scheduler for the replica's ranks
    threshold = _long_prefill_threshold(s.long_prefill_token_threshold, s.max_num_batched_tokens, ranks)
    specs = kv_cache_specs(model, s.max_num_batched_tokens, threshold or s.max_num_batched_tokens * ranks)
    blocks = KVCacheCoordinator(
        num_usable_blocks(cfg, pool), s.block_size, s.enable_prefix_caching, specs=specs
    )
    if cfg.router.policy_for(role) == "kv_aware":
        blocks.publish_kv_events()
    return blocks


def scheduler_for(
    cfg: TestbedConfig, pool: PoolConfig, blocks: KVCacheCoordinator, offload: Sequence[KVLookup] = ()
) -> Scheduler:
    """The scheduler of one replica of `pool` over its KV cache `blocks` (`kv_cache_for`) and its encoder
    cache; `offload`: its offloading connectors (`offload_for`)."""
    s = cfg.scheduler
    ranks = pool.num_attention_ranks  # data-parallel attention: one scheduler for the replica's ranks
    return Scheduler(
        blocks,
        max_num_batched_tokens=s.max_num_batched_tokens * ranks,
        max_num_seqs=s.max_num_seqs * ranks,
        max_num_batched_encoder_embeds=s.encoder_budget,
        encoder_cache=EncoderCache(s.encoder_cache_embeds),
        reserve_full_isl=s.reserve_full_isl,
        long_prefill_token_threshold=_long_prefill_threshold(
            s.long_prefill_token_threshold, s.max_num_batched_tokens, ranks
        ),
        pull_back_reuse=cfg.kv_transfer.reuse,
        offload=offload,
    )


def kv_scheduler_for(
    engine_id: str, role: Role, cfg: TestbedConfig, pool: PoolConfig, scheduler: Scheduler
) -> PDConnectorScheduler:
    """The scheduler side of an engine's KV connector: the timing of transfers into it (from its peer
    pool's TP), how long finished requests hold KV, a hybrid's prefill backoff."""
    kv = cfg.kv_transfer
    peer = {"decode": cfg.pools.prefill, "prefill": cfg.pools.decode}.get(role, pool)  # who sends to it
    receiver = KVReceiver(
        kv,
        link=LINKS[kv.link],
        model=cfg.target.profile,
        block_size=cfg.scheduler.block_size,
        tp=pool.attention_tp,
        peer_tp=peer.attention_tp,
        slowdowns=cfg.faults.link_slowdowns,
    )
    # decode, bidirectional: a finished turn's blocks wait for the conversation's next turn
    hold_timeout_s = (
        kv.decoder_kv_blocks_ttl_s if role == "decode" and kv.bidirectional else kv.hold_timeout_s
    )
    return PDConnectorScheduler(
        engine_id,
        receiver=receiver,
        scheduler=scheduler,
        hold_timeout_s=hold_timeout_s,
        prefill_backoff=prefill_backoff(cfg),
    )


def offload_for(
    engine_id: str,
    cfg: TestbedConfig,
    pool: PoolConfig,
    role: Role,
    blocks: KVCacheCoordinator,
    executor: Executor,
    stats: EngineStats,
    step_clock: StepClock,
    kv_store: KVStoreClient | None,
) -> list[OffloadingConnector]:
    """The offloading connector of one replica of `pool` over its tiers (host memory, then disk, then
    its side of the shared store `kv_store`), each sized in blocks of the replica's KV (every GPU's
    share of a block); none without tiers, and for a decode engine."""
    o = cfg.kv_offload
    if not o.for_role(role):
        return []
    tp, gpu = pool.attention_tp, GPUS[pool.gpu]
    bytes_a_block = block_bytes(cfg.target.profile, pool, cfg.scheduler.block_size)
    tiers: list[Tier] = [
        KVTier(medium, int(gb * 1e9) // bytes_a_block, TierPath(LINKS[link], bytes_a_block, lanes))
        for medium, gb, link, lanes in (
            ("host", o.host_gb, o.host_link or gpu.host_link, tp),  # each GPU copies its share
            ("disk", o.disk_gb, o.disk_link, 1),
        )
        if gb > 0
    ]
    if kv_store is not None:  # last: a block comes from the engine's own tiers first
        assert o.shared_link is not None
        path = TierPath(LINKS[o.shared_link], bytes_a_block, tp)  # (tp lanes: a NIC a GPU)
        tiers.append(SharedKVTier(engine_id, kv_store, path))
    offload = OffloadingConnector(
        tiers, blocks=blocks, executor=executor, stats=stats, wake=step_clock.wake, prompt_only=o.prompt_only
    )
    if cfg.router.policy_for(role) == "kv_aware":
        offload.publish_kv_events()
    return [offload]


def kv_store_args(cfg: TestbedConfig) -> tuple[int, list[str]]:
    """What the shared KV store is made of (`KVStore`'s arguments): its capacity in blocks of the
    target's KV (`kv_offload.shared_gb`), and the engines that call it (those with offload tiers)."""
    block = cfg.target.profile.kv_bytes_per_token * cfg.scheduler.block_size
    tiered = [(role, pool) for role, pool in cfg.pools.by_role() if cfg.kv_offload.for_role(role)]
    return int(cfg.kv_offload.shared_gb * 1e9) // block, [
        replica_id(role, i) for role, pool in tiered for i in range(pool.replicas)
    ]


def prefill_backoff(cfg: TestbedConfig) -> int:
    """Prompt tokens a prefill engine leaves to decode: 1 for a hybrid target (vLLM's N-1 prefill), but
    for the deliberate fault `faults.ssm_state_at_n`; 0 otherwise."""
    return int(cfg.target.profile.ssm is not None and not cfg.faults.ssm_state_at_n)


def _long_prefill_threshold(threshold: int, rank_budget: int, ranks: int) -> int:
    """`scheduler.long_prefill_token_threshold`; with data-parallel attention at most one rank's budget
    (a request's chunk runs on its rank)."""
    if ranks == 1:
        return threshold
    return min(threshold, rank_budget) if threshold else rank_budget


def build_engine(
    engine_id: str,
    role: Role,
    cfg: TestbedConfig,
    pool: PoolConfig,
    clock: Clock,
    runner: ModelRunner | None,
    peers: Mapping[str, KVSource],
    metrics: EngineMetrics | None,
    compute_in_thread: bool = False,
    link: Link | None = None,
    time_model: StepTimeModel | None = None,
    kv_store: KVStoreClient | None = None,
) -> EngineCore:
    """An engine of `pool` in `role`; `peers`: the prefill engines a decode engine pulls from
    (filled in later is fine); `metrics`: its series (None: none); `compute_in_thread`: see
    `Executor`; `link`: the shared link a prefill engine sends on (kv_transfer.link_scope=fabric),
    None: its own; `time_model`: how long its steps take (None: the target's, `time_model_for`; tests
    that step an engine in lockstep with another give every step the same time); `kv_store`: the
    deployment's shared KV store (kv_offload.shared_gb > 0)."""
    s = cfg.scheduler
    time_model = time_model or time_model_for(cfg, pool)
    blocks = kv_cache_for(cfg, pool, role)
    encoder_roofline = encoder_roofline_for(cfg, pool)
    vision = vision_for(cfg) if runner is not None and encoder_roofline is not None else None
    executor = Executor(
        runner, blocks, vocab_size=cfg.runner.vocab_size, in_thread=compute_in_thread, vision=vision
    )
    moe = cfg.target.profile.moe is not None
    # P, D and engines with offload tiers load KV
    stats = EngineStats(
        recorder=metrics, moe_target=moe, kv_consumer=role != "mixed" or cfg.kv_offload.for_role(role)
    )
    step_clock = StepClock(clock)
    offload = offload_for(engine_id, cfg, pool, role, blocks, executor, stats, step_clock, kv_store)
    scheduler = scheduler_for(cfg, pool, blocks, offload)
    kv_scheduler = kv_scheduler_for(engine_id, role, cfg, pool, scheduler)
    f = cfg.faults
    faults = (
        KVLoadFaults(
            rate=f.kv_transfer_failure_rate, nth=f.kv_transfer_failures, seed=cfg.seed, engine_id=engine_id
        )
        if f.kv_transfer_failure_rate > 0 or f.kv_transfer_failures
        else None
    )
    link = LinkQueue(pool.num_attention_ranks) if link is None else link  # its own: a wire a DP rank
    kv_worker = PDConnectorWorker(
        engine_id,
        executor,
        peers=peers,
        stats=stats,
        clock=clock,
        kv_cache=blocks,
        link=link,
        faults=faults,
    )
    return EngineCore(
        engine_id,
        role=role,
        clock=clock,
        step_clock=step_clock,
        time_model=time_model,
        scheduler=scheduler,
        executor=executor,
        kv_scheduler=kv_scheduler,
        kv_worker=kv_worker,
        stats=stats,
        max_model_len=s.max_model_len,
        encoder_roofline=encoder_roofline,
        macro_steps=cfg.runner.macro_steps,
        kv_connectors=offload,
        admission=Admission(
            engine_id,
            scheduler=scheduler,
            max_waiting=s.max_waiting,
            max_queue_time_s=s.max_queue_time_s,
            max_num_queued_reqs=s.max_num_queued_reqs,
            max_num_queued_tokens=s.max_num_queued_tokens,
        ),
    )


def chat_renderer(
    cfg: TestbedConfig, workload: Workload
) -> Callable[[list[dict[str, Any]]], list[int]] | None:
    """The render tier's template and tokenizer in this process, when `workload` holds chat prompts (a
    full-text trace: its prompt tokens come from rendering the real text); else None."""
    if not needs_render(workload):
        return None
    from actors.render.client import render_for

    r = cfg.replay
    tools = list(r.tools) if r.tools else None
    return functools.partial(render_for(cfg).render_chat, tools=tools, **(r.chat_template_kwargs or {}))


def build_encoder(
    encoder_id: str,
    cfg: TestbedConfig,
    clock: Clock,
    compute_in_thread: bool = False,
    metrics: EncoderMetrics | None = None,
) -> EncoderCore:
    """An encoder replica of `cfg.pools.encoder` (its GPU's roofline of the target's vision encoder);
    `metrics`: its series."""
    pool, s = cfg.pools.encoder, cfg.scheduler
    roofline = encoder_roofline_for(cfg, pool)
    assert roofline is not None, "an encoder pool needs a vision-language target (checked with the config)"
    vision = vision_for(cfg) if cfg.runner.compute == "real" else None
    cache = EncoderCache(s.encoder_cache_embeds)
    overhead_s = cfg.target.step_overhead_s
    return EncoderCore(
        encoder_id,
        clock=clock,
        roofline=roofline,
        vision=vision,
        max_num_batched_encoder_embeds=s.encoder_budget,
        cache=cache,
        step_overhead_s=overhead_s,
        in_thread=compute_in_thread,
        recorder=metrics,
    )


def encoder_pool(cfg: TestbedConfig, encoders: Sequence[EncoderClient]) -> EncoderPool | None:
    """The proxy's view of the encoder pool (None without one: the LM engines encode)."""
    if not encoders:
        return None
    vit = vision_encoder_of(cfg.target.model)
    assert vit is not None, "an encoder pool needs a vision-language target (checked with the config)"
    return EncoderPool(encoders, LINKS[cfg.ec_transfer.link], vit.embedding_bytes_per_token)
