"""The runner model: a tiny causal LM with seeded weights, on local disk.

`runner.architecture` picks it: qwen2 (dense), qwen3_moe (transformers' Qwen3-MoE, every layer a
sparse MoE block) or nemotron_h (transformers' Nemotron-H: Mamba2, attention, MoE and MLP layers, computed
by `hybrid_runner.py`). Built once from a config, written with `save_pretrained`, and always loaded back with
`from_pretrained(local_files_only=True)`, the same path a real checkpoint takes. Nothing downloads.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    NemotronHConfig,
    PreTrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen3MoeConfig,
)
from transformers.utils import logging as hf_logging

from actors.engine.runner.arch import check_runner_model
from emulation.config import RunnerConfig

_LOADED: dict[tuple[str, str], PreTrainedModel] = {}
hf_logging.disable_progress_bar()


def cache_dir() -> Path:
    return Path(os.environ.get("TESTBED_CACHE", Path.home() / ".cache" / "disagg-testbed"))


def _shared_sizes(cfg: RunnerConfig) -> dict[str, Any]:
    """The sizes every tiny architecture takes from the runner config (full attention, untied head)."""
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "max_position_embeddings": 65536,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
    }


def tiny_qwen2_config(cfg: RunnerConfig) -> Qwen2Config:
    return Qwen2Config(**_shared_sizes(cfg))


def tiny_qwen3_moe_config(cfg: RunnerConfig) -> Qwen3MoeConfig:
    """Qwen3-MoE with every layer sparse (no dense MLP layers) and no sliding window; the top-k
    routing weights renormalised, as the released Qwen3-MoE checkpoints set (norm_topk_prob)."""
    return Qwen3MoeConfig(
        **_shared_sizes(cfg),
        # written to config.json as Qwen3 checkpoints do (theirs may differ from hidden / heads); the
        # attention reads it with getattr, the config class does not declare it
        head_dim=cfg.hidden_size // cfg.num_heads,  # type: ignore[call-arg]
        num_experts=cfg.num_experts,
        num_experts_per_tok=cfg.num_experts_per_tok,
        moe_intermediate_size=cfg.moe_intermediate_size,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def tiny_nemotron_h_config(cfg: RunnerConfig) -> NemotronHConfig:
    """Nemotron-H with the layers of `hybrid_override_pattern` (num_layers is not read); attention heads
    of hidden / heads; a MoE layer's one shared expert as wide as a routed one; one routing group (the
    released checkpoints' n_group = topk_group = 1)."""
    return NemotronHConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        hybrid_override_pattern=cfg.hybrid_override_pattern,  # type: ignore[call-arg]
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.hidden_size // cfg.num_heads,
        intermediate_size=cfg.intermediate_size,
        mamba_num_heads=cfg.mamba_num_heads,
        mamba_head_dim=cfg.mamba_head_dim,
        n_groups=cfg.n_groups,
        ssm_state_size=cfg.ssm_state_size,
        conv_kernel=cfg.conv_kernel,
        chunk_size=cfg.chunk_size,
        n_routed_experts=cfg.num_experts,
        num_experts_per_tok=cfg.num_experts_per_tok,
        moe_intermediate_size=cfg.moe_intermediate_size,
        moe_shared_expert_intermediate_size=cfg.moe_intermediate_size,
        n_group=1,
        topk_group=1,
        max_position_embeddings=65536,
        tie_word_embeddings=False,
        mamba_ssm_cache_dtype="float32",
    )


def tiny_config(cfg: RunnerConfig) -> PreTrainedConfig:
    """The transformers config of `runner.architecture`'s tiny model."""
    if cfg.architecture == "nemotron_h":
        return tiny_nemotron_h_config(cfg)
    return tiny_qwen3_moe_config(cfg) if cfg.architecture == "qwen3_moe" else tiny_qwen2_config(cfg)


def model_dir(cfg: RunnerConfig) -> Path:
    """Where the runner's weights live: the user's directory, or the cache entry for this tiny config."""
    if cfg.model_path:
        return Path(cfg.model_path)
    fields: list[object] = [
        cfg.hidden_size,
        cfg.num_layers,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.intermediate_size,
        cfg.vocab_size,
        cfg.weights_seed,
    ]
    if cfg.architecture != "qwen2":  # qwen2's key predates the field: its cached entries stay valid
        fields += [cfg.architecture, cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size]
        fields += ["norm_topk_prob"]
    if cfg.architecture == "nemotron_h":  # appended: qwen3_moe's key stays what it was
        fields += [cfg.hybrid_override_pattern, cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.n_groups]
        fields += [cfg.ssm_state_size, cfg.conv_kernel, cfg.chunk_size]
    key = json.dumps(fields)
    return cache_dir() / f"tiny-{cfg.architecture}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def ensure_model(cfg: RunnerConfig) -> Path:
    path = model_dir(cfg)
    if (path / "config.json").exists() or cfg.model_path:
        return path
    torch.manual_seed(cfg.weights_seed)
    model = AutoModelForCausalLM.from_config(tiny_config(cfg), dtype=torch.float32)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    os.replace(tmp, path) if not path.exists() else None
    return path


def runner_device(cfg: RunnerConfig) -> str:
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "runner.device='cuda': this process sees no GPU (in live mode, set runner.num_gpus)"
        )
    return cfg.device


def load_model(cfg: RunnerConfig) -> PreTrainedModel:
    """The runner model on its device, loaded once per process and shared read-only by its engines."""
    if cfg.model_path:
        check_runner_model(cfg.model_path)
    path, device = str(ensure_model(cfg)), runner_device(cfg)
    if (path, device) not in _LOADED:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
        model.requires_grad_(False)
        _LOADED[path, device] = torch.nn.Module.to(model, device).eval()
    return _LOADED[path, device]
