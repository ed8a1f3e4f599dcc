"""Engine settings the user left unset take vLLM's defaults for the pools' GPU (emulation.vllm_defaults),
resolved once at the configuration edge so that every run's written config shows the values used.

One scheduler config serves every LM pool, so pools whose GPUs vLLM would give different defaults
(an H200 prefill pool beside an L40S decode pool) are refused in one line asking for the values to
be set, rather than one side silently taking the other's.
"""

from __future__ import annotations

import dataclasses

from cluster.config_rules_hybrid import engine_pools
from emulation.config import TestbedConfig
from emulation.profiles import GPUS
from emulation.vllm_defaults import batch_defaults, default_block_size

DEFAULTED = ("max_num_batched_tokens", "max_num_seqs", "block_size")
"""The scheduler fields that follow vLLM's device defaults unless set."""


def resolve_engine_defaults(cfg: TestbedConfig, configured: set[str]) -> TestbedConfig | str:
    """`cfg` with each of DEFAULTED not in `configured` set to vLLM's default for its LM pools' GPU,
    or the one line saying why it cannot be (pools disagree); `cfg` as it is where a GPU is unknown
    (a rule names it)."""
    unset = [name for name in DEFAULTED if name not in configured]
    pools = engine_pools(cfg)
    if not unset or not pools or any(pool.gpu not in GPUS for _, pool in pools):
        return cfg
    model = cfg.target.profile
    choices = {
        name: (*batch_defaults(GPUS[pool.gpu]), default_block_size(model, GPUS[pool.gpu]))
        for name, pool in pools
    }
    values = dict(zip(DEFAULTED, next(iter(choices.values())), strict=True))
    differing = [
        field
        for i, field in enumerate(DEFAULTED)
        if field in unset and len({c[i] for c in choices.values()}) > 1
    ]
    if differing:
        seen = "; ".join(
            f"pools.{n} ({p.gpu}): {dict(zip(DEFAULTED, choices[n], strict=True))}" for n, p in pools
        )
        return (
            f"scheduler.{differing[0]}: unset, and vLLM's defaults differ between the pools' GPUs ({seen}); "
            f"allowed: set scheduler.{', scheduler.'.join(differing)} for all pools"
        )
    s = cfg.scheduler
    tokens = (
        s.max_num_batched_tokens
        if "max_num_batched_tokens" in configured
        else values["max_num_batched_tokens"]
    )
    seqs = s.max_num_seqs if "max_num_seqs" in configured else values["max_num_seqs"]
    if "max_num_batched_tokens" not in configured:  # vLLM clamps defaults only
        tokens = min(tokens, seqs * s.max_model_len)
    if "max_num_seqs" not in configured:
        seqs = min(seqs, tokens)
    block_size = s.block_size if "block_size" in configured else values["block_size"]
    scheduler = dataclasses.replace(
        s, max_num_batched_tokens=tokens, max_num_seqs=seqs, block_size=block_size
    )
    return dataclasses.replace(cfg, scheduler=scheduler)
