"""What a config's fields cannot say alone: how fields and sections fit together, and what only the
profiles, the files named and other layers' parsers can tell.

`violations` yields one line per broken rule; its caller reports the first, so a later rule may assume
that every earlier one held (a pool's GPU is known before its KV room is computed).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from actors.engine.runner_arch import UnsupportedModelError, check_runner_model
from emulation.config import PoolConfig, TestbedConfig
from emulation.kv_cache import NUM_NULL_BLOCKS, cdiv, num_gpu_blocks
from emulation.moe import expert_popularity
from emulation.profiles import GPUS, MODELS, ModelProfile
from workloads.slo import SloError, parse_slo
from workloads.traces.multi_turn import parse_dist


def violations(cfg: TestbedConfig) -> Iterator[str]:
    """Every broken rule of `cfg`, in one line each, in a fixed order."""
    for rules in (_scheduler, _experts, _pools, _workload, _replay, _multi_turn, _runner, _rest, _faults):
        yield from rules(cfg)


def _scheduler(cfg: TestbedConfig) -> Iterator[str]:
    s = cfg.scheduler
    need = cfg.workload.prompt_len + cfg.workload.output_len
    if s.max_num_batched_tokens < s.block_size:
        yield (
            f"scheduler.max_num_batched_tokens={s.max_num_batched_tokens}: "
            f"must be >= block_size ({s.block_size})"
        )
    if s.max_model_len < need:
        yield (
            f"scheduler.max_model_len={s.max_model_len}: the workload's requests need "
            f"{need} tokens (prompt_len + output_len); allowed: at least that"
        )


def _experts(cfg: TestbedConfig) -> Iterator[str]:
    """Expert parallelism: only for a MoE target, filling its ranks evenly, within the fabric."""
    model = MODELS[cfg.target.model]
    moe_models = ", ".join(n for n, m in MODELS.items() if m.moe)
    for name, pool in (
        ("mixed", cfg.pools.mixed),
        ("prefill", cfg.pools.prefill),
        ("decode", cfg.pools.decode),
    ):
        if pool.replicas and pool.gpu in GPUS:
            yield from _pool_experts(cfg, f"pools.{name}", pool, model, moe_models)
    r = cfg.target.moe_routing
    if r.skew != "uniform" and model.moe is None:
        yield f"target.moe_routing.skew={r.skew!r}: target.model={model.name!r} is dense; allowed: uniform"
    elif r.skew == "file" and model.moe is not None:
        try:
            expert_popularity("file", model.moe.num_experts, loads_file=r.loads_file)
        except (OSError, ValueError) as e:
            yield f"target.moe_routing.loads_file={r.loads_file!r}: {e}"


def _pool_experts(cfg: TestbedConfig, key: str, pool: PoolConfig, model: ModelProfile, moe_models: str
                  ) -> Iterator[str]:  # fmt: skip
    ep, given = pool.ep, [(f, v) for f, v in _ep_fields(pool) if v]
    if model.moe is None:
        for field, value in given[:1]:
            yield (
                f"{key}.{field}={value}: target.model={model.name!r} is dense (no experts); allowed: the "
                f"default, or a mixture-of-experts target ({moe_models})"
            )
        return
    slots = model.moe.num_experts + pool.num_redundant_experts
    if slots % ep:
        divisors = [d for d in range(1, slots + 1) if slots % d == 0]
        yield (
            f"{key}.ep={ep}: {model.name}'s {model.moe.num_experts} routed experts + "
            f"num_redundant_experts={pool.num_redundant_experts} do not fill {ep} EP ranks evenly; allowed: "
            f"an ep dividing {slots} ({', '.join(map(str, divisors))}), or more redundant experts"
        )
    needs = (
        ("num_redundant_experts", pool.num_redundant_experts, ep > 1, "ep > 1 (copies go to other ranks)"),
        ("dp_attention", pool.dp_attention, ep > 1, "ep > 1 (the attention ranks are the EP ranks)"),
        ("enable_dbo", pool.enable_dbo, pool.dp_attention, "dp_attention=True (it hides all-to-alls)"),
    )
    for field, value, holds, need in needs:
        if value and not holds:
            yield f"{key}.{field}={value}: allowed only with {need}"
    fabric, gpu = cfg.target.ep_fabric, GPUS[pool.gpu]
    per_node = fabric.gpus_per_node or gpu.gpus_per_node
    nodes = cdiv(pool.num_gpus, per_node)
    if pool.tp > per_node:
        yield f"{key}.tp={pool.tp}: one rank's GPUs share a node of {per_node}; allowed: at most {per_node}"
    elif pool.attention_tp > per_node:  # an all-reduce every layer over the NICs: not what vLLM runs
        yield (
            f"{key}: tensor-parallel attention over ep x tp = {pool.attention_tp} GPUs spans {nodes} nodes "
            f"of {per_node}; allowed: at most {per_node} GPUs, or dp_attention=true (attention ranks of tp)"
        )
    elif nodes > fabric.max_nodes:
        yield (
            f"{key}: ep x tp = {ep} x {pool.tp} = {pool.num_gpus} GPUs span {nodes} nodes of {per_node}; "
            f"allowed: at most target.ep_fabric.max_nodes={fabric.max_nodes} nodes"
        )


def _ep_fields(pool: PoolConfig) -> tuple[tuple[str, object], ...]:
    """The expert-parallel fields of `pool`, a falsy value where left at its default."""
    return (
        ("ep", pool.ep if pool.ep > 1 else 0),
        ("dp_attention", pool.dp_attention),
        ("num_redundant_experts", pool.num_redundant_experts),
        ("enable_dbo", pool.enable_dbo),
    )


def _pools(cfg: TestbedConfig) -> Iterator[str]:
    s = cfg.scheduler
    p = cfg.pools
    need = cdiv(cfg.workload.prompt_len + cfg.workload.output_len, s.block_size)
    for name, pool in (("mixed", p.mixed), ("prefill", p.prefill), ("decode", p.decode)):
        if not pool.replicas:
            continue
        if pool.gpu not in GPUS:
            yield f"pools.{name}.gpu={pool.gpu!r}: unknown GPU; allowed: {', '.join(GPUS)}"
        have = num_gpu_blocks(cfg, pool) // pool.num_attention_ranks  # a request's KV is on one rank
        a_rank = " a rank" if pool.num_attention_ranks > 1 else ""
        if have - NUM_NULL_BLOCKS < need:
            yield (
                f"pools.{name}: {cfg.target.model} on {pool.num_gpus} x {pool.gpu} leaves KV room for "
                f"{have - NUM_NULL_BLOCKS} blocks{a_rank} (and vLLM's null block), a request needs {need}; "
                "allowed: a larger tp or GPU, or shorter requests"
            )
        # As vLLM refuses at start-up: a request of max_model_len tokens must fit in the KV cache
        # (else one could wait for blocks that never come free).
        key = "scheduler.num_gpu_blocks_override" if s.num_gpu_blocks_override else f"pools.{name}"
        if have * s.block_size < s.max_model_len:
            yield (
                f"{key}: {have} blocks{a_rank} of {s.block_size} hold {have * s.block_size} tokens of KV, "
                "less "
                f"than scheduler.max_model_len={s.max_model_len}; allowed: at least "
                f"{cdiv(s.max_model_len, s.block_size)} blocks, or a smaller max_model_len"
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
        yield f"pools.encoder.gpu={e.gpu!r}: unknown GPU; allowed: {', '.join(GPUS)}"
    if e.replicas and MODELS[cfg.target.model].vision_encoder is None:
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
        and MODELS[cfg.target.model].vision_encoder is None
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
