"""What a config's fields cannot say alone: how fields and sections fit together, and what only the
profiles, the files named and other layers' parsers can tell.

`violations` yields one line per broken rule; its caller reports the first, so a later rule may assume
that every earlier one held (a pool's GPU is known before its KV room is computed).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from actors.engine.runner.arch import UnsupportedModelError, check_runner_model
from cluster.config_rules_experts import experts
from cluster.config_rules_hybrid import hybrid
from cluster.config_rules_target import target, unknown_gpu
from emulation.config import PoolConfig, TestbedConfig
from emulation.kv_cache import NUM_NULL_BLOCKS, block_bytes, cdiv, max_window_blocks, num_gpu_blocks
from emulation.profiles import GPUS, LINKS, MODELS
from workloads.slo import SloError, parse_slo
from workloads.synthetic import output_len_bounds, prompt_len_bounds
from workloads.traces.multi_turn import parse_dist


def violations(cfg: TestbedConfig) -> Iterator[str]:
    """Every broken rule of `cfg`, in one line each, in a fixed order."""
    for rules in (
        _scheduler,
        experts,
        hybrid,
        target,
        _pools,
        _workload,
        _replay,
        _multi_turn,
        _runner,
        _rest,
        _offload,
        _faults,
        _load_shape,
    ):
        yield from rules(cfg)


def _scheduler(cfg: TestbedConfig) -> Iterator[str]:
    s = cfg.scheduler
    need = cfg.workload.prompt_len + cfg.workload.output_len
    if s.max_num_batched_tokens < s.block_size and cfg.target.profile.ssm is None:  # (a hybrid's
        # raised blocks may exceed the budget: vLLM then chunks below a block and re-aligns)
        yield (
            f"scheduler.max_num_batched_tokens={s.max_num_batched_tokens}: "
            f"must be >= block_size ({s.block_size})"
        )
    if s.max_model_len < need:
        yield (
            f"scheduler.max_model_len={s.max_model_len}: the workload's requests need "
            f"{need} tokens (prompt_len + output_len); allowed: at least that"
        )


def _pools(cfg: TestbedConfig) -> Iterator[str]:
    s = cfg.scheduler
    p = cfg.pools
    # a hybrid's request also holds a state block a Mamba group, and its checkpoint's while caching it;
    # a sliding-window model's, its window's blocks in each sliding group
    groups, model = cfg.target.profile.kv_cache_groups, cfg.target.profile
    states = groups.num_state_groups * (1 + s.enable_prefix_caching)
    if groups.num_sliding_groups:
        assert model.sliding_window is not None
        cap = max_window_blocks(model.sliding_window, s.block_size, s.max_num_batched_tokens)
        states += groups.num_sliding_groups * min(cap, cdiv(s.max_model_len, s.block_size))
    need = cdiv(cfg.workload.prompt_len + cfg.workload.output_len, s.block_size) + states
    for name, pool in (("mixed", p.mixed), ("prefill", p.prefill), ("decode", p.decode)):
        if not pool.replicas:
            continue
        if pool.gpu not in GPUS:
            yield unknown_gpu(f"pools.{name}.gpu", pool.gpu)
        have = num_gpu_blocks(cfg, pool) // pool.num_attention_ranks  # a request's KV is on one rank
        a_rank = " a rank" if pool.num_attention_ranks > 1 else ""
        if have - NUM_NULL_BLOCKS < need:
            yield (
                f"pools.{name}: {cfg.target.model} on {_kv_gpus(pool)} x {pool.gpu} leaves KV room for "
                f"{have - NUM_NULL_BLOCKS} blocks{a_rank} (and vLLM's null block), a request needs {need}; "
                "allowed: a larger tp or GPU, or shorter requests"
            )
        # As vLLM refuses at start-up: a request of max_model_len tokens must fit in the KV cache
        # (else one could wait for blocks that never come free).
        key = "scheduler.num_gpu_blocks_override" if s.num_gpu_blocks_override else f"pools.{name}"
        if (have - states) * s.block_size < s.max_model_len:
            beside = " beside a request's states or window" if states else ""
            yield (
                f"{key}: {have} blocks{a_rank} of {s.block_size} hold {(have - states) * s.block_size} "
                f"tokens of KV{beside}, less "
                f"than scheduler.max_model_len={s.max_model_len}; allowed: at least "
                f"{cdiv(s.max_model_len, s.block_size) + states} blocks, or a smaller max_model_len"
            )
    collocated = p.mixed.replicas > 0 and p.prefill.replicas == 0 and p.decode.replicas == 0
    disagg = p.mixed.replicas == 0 and p.prefill.replicas > 0 and p.decode.replicas > 0
    if not (collocated or disagg):
        yield (
            f"pools: mixed={p.mixed.replicas}, prefill={p.prefill.replicas}, decode={p.decode.replicas}; "
            "allowed: mixed > 0 alone (collocated) or prefill > 0 and decode > 0 with mixed = 0 (P/D)"
        )
    e = p.encoder
    if e.replicas and e.gpu not in GPUS:
        yield unknown_gpu("pools.encoder.gpu", e.gpu)
    if e.replicas and cfg.target.profile.vision_encoder is None:
        vl = ", ".join(n for n, m in MODELS.items() if m.vision_encoder)
        yield (
            f"pools.encoder.replicas={e.replicas}: target.model={cfg.target.model!r} has no vision encoder; "
            f"allowed: a vision-language model ({vl})"
        )


def _workload(cfg: TestbedConfig) -> Iterator[str]:
    w = cfg.workload
    try:
        parse_dist(w.images_per_request)
    except ValueError as e:
        yield f"workload.images_per_request={e}"
    if (
        w.kind == "synthetic"
        and w.images_per_request != "constant:0"
        and cfg.target.profile.vision_encoder is None
    ):
        yield (
            f"workload.images_per_request={w.images_per_request!r}: target.model={cfg.target.model!r} has "
            "no vision encoder; allowed: a vision-language model (e.g. qwen2.5-vl-7b), or constant:0"
        )
    if w.output_policy == "greedy" and cfg.runner.compute == "skip":
        yield "workload.output_policy='greedy': needs real logits; allowed with runner.compute='real' only"
    for text in cfg.slos:
        try:
            parse_slo(text)
        except SloError as e:
            yield str(e)


def _replay(cfg: TestbedConfig) -> Iterator[str]:
    r = cfg.replay
    if cfg.workload.kind == "trace" and r.trace is None:
        yield "workload.kind='trace': needs replay.trace (a trace file or directory)"
    if r.trace is not None and not Path(r.trace).exists():
        yield f"replay.trace={r.trace!r}: no such file or directory"
    if r.harness_edit != "none" and r.history != "model":
        yield (
            f"replay.harness_edit={r.harness_edit!r}: edits the server's answers, needs replay.history=model"
        )


def _multi_turn(cfg: TestbedConfig) -> Iterator[str]:
    m = cfg.multi_turn
    for key in ("strip_answer_tokens", "rewrite_answer_tokens"):
        value = getattr(m, key)
        if value and m.history != "model":
            yield f"multi_turn.{key}={value}: edits the model's answers, needs multi_turn.history=model"
    for key in ("num_turns", "prefix_tokens", "user_tokens", "output_tokens", "think_s"):
        try:
            parse_dist(getattr(m, key))
        except ValueError as e:
            yield f"multi_turn.{key}={e}"


def _runner(cfg: TestbedConfig) -> Iterator[str]:
    r = cfg.runner
    if r.hidden_size % r.num_heads:
        yield f"runner.hidden_size={r.hidden_size}: must be a multiple of num_heads ({r.num_heads})"
    if r.num_heads % r.num_kv_heads:
        yield f"runner.num_kv_heads={r.num_kv_heads}: must divide num_heads ({r.num_heads})"
    if r.architecture == "qwen3_moe" and r.num_experts_per_tok > r.num_experts:
        yield f"runner.num_experts_per_tok={r.num_experts_per_tok}: at most num_experts ({r.num_experts})"
    if r.model_path is not None and r.architecture != "qwen2":
        yield (
            f"runner.architecture={r.architecture!r}: names the tiny model built when model_path is None; "
            "with runner.model_path set, its config.json names the architecture (leave architecture unset)"
        )
    if r.model_path is not None:
        try:
            check_runner_model(r.model_path)
        except UnsupportedModelError as e:
            yield str(e)


def _rest(cfg: TestbedConfig) -> Iterator[str]:
    kv = cfg.kv_transfer
    if kv.layerwise and kv.mode != "push":
        yield "kv_transfer.layerwise=True: allowed with kv_transfer.mode='push' only"
    if kv.bidirectional and kv.mode != "pull":
        yield "kv_transfer.bidirectional=True: allowed with kv_transfer.mode='pull' only"
    if kv.bidirectional and not cfg.scheduler.enable_prefix_caching:
        yield "kv_transfer.bidirectional=True: needs scheduler.enable_prefix_caching=True (matched by hash)"
    for key in ("tokenizer_path", "chat_template_path"):
        path = getattr(cfg.render, key)
        if path is not None and not Path(path).exists():
            yield f"render.{key}={path!r}: no such file or directory"


def _offload(cfg: TestbedConfig) -> Iterator[str]:
    """KV offload tiers: within the host memory of the GPUs they serve (decode engines have none), of
    a target they can hold, at least a block each."""
    o = cfg.kv_offload
    if not o.enabled:
        return
    if not cfg.scheduler.enable_prefix_caching:
        yield "kv_offload: needs scheduler.enable_prefix_caching=True (tiers find blocks by hash)"
    if cfg.target.profile.ssm is not None:
        yield (
            f"kv_offload: {cfg.target.model} is hybrid and offloading its SSM states is not emulated; "
            "allowed: host_gb, disk_gb and shared_gb 0"
        )
    pools = [(role, pool) for role, pool in cfg.pools.by_role() if pool.replicas > 0]
    host_gb = {role: _kv_gpus(pool) * GPUS[pool.gpu].host_memory_gb for role, pool in pools}
    tiered = [(role, pool) for role, pool in pools if o.for_role(role)]
    for role, pool in tiered:
        if o.host_gb > host_gb[role]:
            yield (
                f"kv_offload.host_gb={o.host_gb:g}: more than the host memory of a {role} replica's GPUs "
                f"({_kv_gpus(pool)} x {pool.gpu} at {GPUS[pool.gpu].host_memory_gb:g} GB, "
                f"GpuProfile.host_memory_gb); allowed: 0 to {host_gb[role]:g}"
            )
        one_block_gb = block_bytes(cfg.target.profile, pool, cfg.scheduler.block_size) / 1e9
        for key in ("host_gb", "disk_gb", "shared_gb"):
            if 0 < getattr(o, key) < one_block_gb:
                yield (
                    f"kv_offload.{key}={getattr(o, key):g}: holds no KV block of {cfg.target.model} "
                    f"({one_block_gb:g} GB a block); allowed: 0 or at least {one_block_gb:g}"
                )
    if o.shared_gb > 0 and o.shared_link is None:
        yield (
            f"kv_offload.shared_link=None: a shared store (shared_gb={o.shared_gb:g}) needs a link; "
            f"allowed: one of {', '.join(LINKS)}"
        )
    total_gb = sum(pool.replicas * host_gb[role] for role, pool in pools)
    tiers_gb = o.host_gb * sum(pool.replicas for _, pool in tiered)
    if o.shared_gb > total_gb - tiers_gb:
        yield (
            f"kv_offload.shared_gb={o.shared_gb:g}: beside the engines' host tiers ({tiers_gb:g} GB), more "
            f"than the host memory of the deployment's GPUs ({total_gb:g} GB); "
            f"allowed: 0 to {max(0.0, total_gb - tiers_gb):g}"
        )


def _faults(cfg: TestbedConfig) -> Iterator[str]:
    f = cfg.faults
    for i, w in enumerate(f.link_slowdowns):
        if w.start_s >= w.end_s:
            yield (
                f"faults.link_slowdowns[{i}]: start_s={w.start_s}, end_s={w.end_s}; "
                "allowed: start_s < end_s (emulated seconds)"
            )
    engines = cfg.pools.engine_ids()
    prefill = [e for e in engines if e.startswith("prefill-")]
    for kind, allowed in (("engine_kills", engines), ("engine_hangs", prefill)):
        for fault in getattr(f, kind):
            if fault.engine not in allowed:
                yield (
                    f"faults.{kind}: engine={fault.engine!r}: no such "
                    f"{'prefill ' * (kind == 'engine_hangs')}engine; allowed: {', '.join(allowed) or 'none'}"
                )
    if f.engine_hangs and cfg.router.prefill_timeout_s is None:
        yield (
            "faults.engine_hangs: a hung prefill engine holds its requests for ever without "
            "router.prefill_timeout_s; allowed: set it (emulated seconds)"
        )


def _kv_gpus(pool: PoolConfig) -> int:
    """The GPUs of a replica of `pool` that hold KV: all of them, or with AFD its attention ranks'."""
    return pool.num_gpus if pool.afd is None else pool.num_attention_ranks * pool.tp


def _load_shape(cfg: TestbedConfig) -> Iterator[str]:
    """How a synthetic workload is sent and sized: closed loop over synthetic requests only, a warm-up
    that leaves requests to measure, and ranged lengths (`random_range_ratio`) that vLLM would draw and
    the engines would take."""
    w = cfg.workload
    if w.max_concurrency is not None and w.kind != "synthetic":
        yield (
            f"workload.max_concurrency={w.max_concurrency}: closed loop over synthetic requests only; "
            f"workload.kind={w.kind!r} replays sessions, whose closed loop is replay.max_sessions "
            "(top-level sessions at once); allowed: null here"
        )
    if w.kind == "synthetic" and w.num_warmup_requests >= w.num_requests:
        yield (
            f"workload.num_warmup_requests={w.num_warmup_requests}: leaves none of "
            f"workload.num_requests={w.num_requests} to measure; allowed: 0 to {w.num_requests - 1}"
        )
    if w.kind != "synthetic" or w.random_range_ratio == 0:
        return
    (shortest, longest), (_, longest_output) = prompt_len_bounds(w), output_len_bounds(w)
    if shortest < 1:  # as vLLM refuses it (RandomDataset.sample)
        yield (
            f"workload.random_range_ratio={w.random_range_ratio:g}: draws prompts of {shortest} tokens "
            f"from prompt_len={w.prompt_len}; allowed: a ratio or prompt_len with "
            "floor(prompt_len x (1 - ratio)) >= 1"
        )
    max_model_len = cfg.scheduler.max_model_len
    if longest + longest_output > max_model_len:
        yield (
            f"workload.random_range_ratio={w.random_range_ratio:g}: the longest requests need "
            f"{longest + longest_output} tokens (prompt {longest} + output {longest_output}), more than "
            f"scheduler.max_model_len={max_model_len}; allowed: a smaller ratio, or a larger max_model_len"
        )
