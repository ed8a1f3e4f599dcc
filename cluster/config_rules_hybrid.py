"""The rules of hybrid (attention + SSM) targets: the block size that makes a page hold a state, and the
settings that mean nothing or cannot work for one.

vLLM raises the attention block size of a hybrid until one block's KV page holds an SSM layer's state
(`ssm.hybrid_page`, "may override user settings"). Here a block size left unset is raised the same way,
for the largest page the pools need (P/D pools must share one geometry: vLLM's NIXL connector takes no
heterogeneous block sizes for hybrids); one the user set that cannot hold the state is refused, not
overridden, so that a configured value is never silently another.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from emulation.config import PoolConfig, TestbedConfig
from emulation.profiles import MODELS, ModelProfile


def engine_pools(cfg: TestbedConfig) -> list[tuple[str, PoolConfig]]:
    p = cfg.pools
    return [
        (n, pool)
        for n, pool in (("mixed", p.mixed), ("prefill", p.prefill), ("decode", p.decode))
        if pool.replicas
    ]


def hybrid_block_size(cfg: TestbedConfig) -> int:
    """The block size every pool of a hybrid target uses: the configured one raised until each pool's
    page holds a state (`ModelProfile.page` at the pool's attention TP); the configured one otherwise."""
    model, block_size = cfg.target.profile, cfg.scheduler.block_size
    if model.ssm is None:
        return block_size
    return max(
        [block_size] + [model.page(pool.attention_tp, block_size).block_size for _, pool in engine_pools(cfg)]
    )


def resolve_block_size(cfg: TestbedConfig, *, configured: bool) -> TestbedConfig | str:
    """`cfg` with its hybrid target's block size raised (`hybrid_block_size`), or the one line saying
    why a `configured` (user-set) block size cannot hold the state."""
    raised = hybrid_block_size(cfg)
    if raised == cfg.scheduler.block_size:
        return cfg
    if configured:
        return _too_small(cfg)
    return dataclasses.replace(cfg, scheduler=dataclasses.replace(cfg.scheduler, block_size=raised))


def _too_small(cfg: TestbedConfig) -> str:
    model, block_size = cfg.target.profile, cfg.scheduler.block_size
    name, pool = next(
        (n, p) for n, p in engine_pools(cfg) if model.page(p.attention_tp, block_size).block_size > block_size
    )
    tp = pool.attention_tp
    state, per_token = model.state_bytes_per_layer(tp), model.kv_bytes_per_token_per_layer(tp)
    need = -(-state // int(per_token))
    return (
        f"scheduler.block_size={block_size}: a page of {model.name} (pools.{name}, tp {tp}) must hold one "
        f"SSM layer's state, {state:,} B = {state / per_token:,.1f} tokens of a layer's KV "
        f"({per_token:,.0f} B each); "
        f"allowed: at least {need:,}, or leave it unset to have it raised as vLLM does "
        f"({model.page(tp, block_size).block_size:,})"
    )


def hybrid(cfg: TestbedConfig) -> Iterator[str]:
    """SSM settings on a model without SSM layers, and what a hybrid target cannot do here."""
    model, t = cfg.target.profile, cfg.target
    hybrids = ", ".join(n for n, m in MODELS.items() if m.ssm)
    if cfg.runner.compute == "real" and (cfg.runner.architecture == "nemotron_h") != (model.ssm is not None):
        yield (
            f"runner.architecture={cfg.runner.architecture!r}: real compute of target.model={model.name!r} "
            "needs a runner that keeps what it keeps (a hybrid target's SSM states, a dense one's KV only); "
            f"allowed: {'nemotron_h' if model.ssm else 'qwen2 or qwen3_moe'}, or runner.compute=skip"
        )
    if model.ssm is None:
        if t.mamba_ssm_cache_dtype != "auto":
            yield (
                f"target.mamba_ssm_cache_dtype={t.mamba_ssm_cache_dtype!r}: target.model={model.name!r} has "
                f"no SSM layers; allowed: auto, or a hybrid target ({hybrids})"
            )
        if cfg.faults.ssm_state_at_n:
            yield (
                f"faults.ssm_state_at_n=true: target.model={model.name!r} has no SSM state to hand over; "
                f"allowed: false, or a hybrid target ({hybrids})"
            )
        return
    yield from _hybrid_target(cfg, model)


def _hybrid_target(cfg: TestbedConfig, model: ModelProfile) -> Iterator[str]:
    for name, pool in engine_pools(cfg):
        if pool.afd is not None:
            yield (
                f"pools.{name}.afd: attention-FFN disaggregation of a hybrid target ({model.name}) is not "
                "modelled (its SSM layers' state would stay with the attention ranks); allowed: none (unset)"
            )
    if cfg.kv_transfer.bidirectional:
        yield (
            f"kv_transfer.bidirectional=true: {model.name} is hybrid; a pull back takes decode's blocks up "
            "to a point of the next prompt, but an SSM state exists only as of decode's last token (and vLLM "
            "keeps prompt states at block boundaries only), so no state matches; allowed: false"
        )
