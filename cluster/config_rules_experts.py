"""The rules of mixture-of-experts pools: expert parallelism (ranks filled evenly, within the fabric)
and attention-FFN disaggregation (a MoE target, a link, A % F == 0, experts that fit the FFN ranks).

`experts` yields one line per broken rule, as `config_rules.violations` expects.
"""

from __future__ import annotations

from collections.abc import Iterator

from cluster.config_rules_target import unknown_gpu
from emulation.config import AfdConfig, PoolConfig, TestbedConfig
from emulation.expert_parallel import ffn_weight_bytes_per_gpu
from emulation.kv_cache import cdiv
from emulation.moe import expert_popularity
from emulation.profiles import GPUS, LINKS, MODELS, GpuProfile, ModelProfile


def experts(cfg: TestbedConfig) -> Iterator[str]:
    """Expert parallelism and AFD: only for a MoE target, filling its ranks evenly, within the fabric."""
    model = cfg.target.profile
    moe_models = ", ".join(n for n, m in MODELS.items() if m.moe)
    for name, pool in (
        ("mixed", cfg.pools.mixed),
        ("prefill", cfg.pools.prefill),
        ("decode", cfg.pools.decode),
    ):
        if pool.replicas and pool.gpu in GPUS:
            key = f"pools.{name}"
            if pool.afd is not None:
                yield from _pool_afd(cfg, key, pool, model, moe_models)
            else:
                yield from _pool_experts(cfg, key, pool, model, moe_models)
    if cfg.pools.encoder.afd is not None:
        yield "pools.encoder.afd: the vision encoder has no experts to disaggregate; allowed: none (unset)"
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
        yield (
            f"{key}.ep={ep}: {model.name}'s {model.moe.num_experts} routed experts + "
            f"num_redundant_experts={pool.num_redundant_experts} do not fill {ep} EP ranks evenly; allowed: "
            f"an ep dividing {slots} ({_divisors(slots)}), or more redundant experts"
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


def _pool_afd(cfg: TestbedConfig, key: str, pool: PoolConfig, model: ModelProfile, moe_models: str
              ) -> Iterator[str]:  # fmt: skip
    afd, k = pool.afd, f"{key}.afd"
    assert afd is not None
    if model.moe is None:
        yield (
            f"{k}: target.model={model.name!r} is dense (no experts to put on FFN ranks); allowed: no afd, "
            f"or a mixture-of-experts target ({moe_models})"
        )
        return
    if cfg.target.time_model == "aggregate":
        yield (
            f"{k}: target.time_model={cfg.target.time_model!r} times a step as a whole; allowed: operators, "
            "or measured (AFD pipelines attention and the experts, timed apart, on their rooflines)"
        )
    for field, value in _ep_fields(pool):
        if value:
            yield (
                f"{key}.{field}={value}: with afd the experts are on the FFN ranks; allowed: the default "
                "(lay them out with afd.ffn_ep and afd.ffn_tp, micro-batches with afd.num_micro_batches)"
            )
    a, f = afd.num_attention_ranks, afd.num_ffn_ranks
    if a % f:
        yield (
            f"{k}.num_ffn_ranks={f}: num_attention_ranks={a} is not a multiple of it (each FFN rank serves "
            f"A/F consecutive attention ranks, as vLLM's AFD plugin requires); allowed: {_divisors(a)}"
        )
    if afd.link not in LINKS:
        yield (
            f"{k}.link={afd.link!r}: hidden states cross to the FFN ranks and back at every MoE layer over "
            f"this link; allowed: {', '.join(LINKS)}"
        )
    ffn_gpu = afd.ffn_gpu or pool.gpu
    if ffn_gpu not in GPUS:
        yield unknown_gpu(f"{k}.ffn_gpu", ffn_gpu)
        return
    if model.moe.num_experts % afd.ffn_ep:
        yield (
            f"{k}.ffn_ep={afd.ffn_ep}: {model.name}'s {model.moe.num_experts} routed experts do not fill "
            f"{afd.ffn_ep} GPUs evenly; allowed: an ffn_ep dividing it ({_divisors(model.moe.num_experts)})"
        )
    gpu = GPUS[ffn_gpu]
    usable = gpu.memory_gb * 1e9 * cfg.target.gpu_memory_utilization
    held = ffn_weight_bytes_per_gpu(model, afd)
    if held > usable:
        yield (
            f"{k}.ffn_ep={afd.ffn_ep}: {model.name}'s experts take {held / 1e9:.1f} GB on each of an FFN "
            f"rank's {afd.ffn_ep} x ffn_tp={afd.ffn_tp} {ffn_gpu}s, more than their {usable / 1e9:.1f} GB; "
            "allowed: a larger ffn_ep or ffn_tp"
        )
    yield from _afd_spans(cfg, k, pool, afd, gpu)


def _afd_spans(cfg: TestbedConfig, k: str, pool: PoolConfig, afd: AfdConfig, ffn_gpu: GpuProfile
               ) -> Iterator[str]:  # fmt: skip
    """An attention rank's and an expert's tensor-parallel GPUs share a node; an FFN rank's GPUs are
    within the EP fabric's reach; the runner model has experts to send across when it computes."""
    fabric = cfg.target.ep_fabric
    for field, tp, gpu in ((k.removesuffix(".afd") + ".tp", pool.tp, GPUS[pool.gpu]),
                           (f"{k}.ffn_tp", afd.ffn_tp, ffn_gpu)):  # fmt: skip
        per_node = fabric.gpus_per_node or gpu.gpus_per_node
        if tp > per_node:
            yield (
                f"{field}={tp}: a tensor-parallel group's GPUs share a node of {per_node}; allowed: at most "
                f"{per_node}"
            )
    per_node = fabric.gpus_per_node or ffn_gpu.gpus_per_node
    nodes = cdiv(afd.ffn_gpus_per_rank, per_node)
    if nodes > fabric.max_nodes:
        yield (
            f"{k}.ffn_ep={afd.ffn_ep}: an FFN rank's {afd.ffn_gpus_per_rank} GPUs span {nodes} "
            f"nodes of {per_node}; allowed: at most target.ep_fabric.max_nodes={fabric.max_nodes}"
        )
    r = cfg.runner
    if r.compute == "real" and r.model_path is None and r.architecture != "qwen3_moe":
        yield (
            f"runner.architecture={r.architecture!r}: {k} sends each MoE layer's hidden states to the FFN "
            "ranks, and this runner model has no experts (runner.compute='real'); allowed: qwen3_moe, or "
            "runner.compute=skip"
        )


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
