"""The runner model: a tiny Qwen2-architecture causal LM with seeded weights, on local disk.

Built once from a config, written with `save_pretrained`, and always loaded back with
`from_pretrained(local_files_only=True)`, the same path a real checkpoint takes. Nothing downloads.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config
from transformers.utils import logging as hf_logging

from actors.engine.runner_arch import check_runner_model
from emulation.config import RunnerConfig

_LOADED: dict[tuple[str, str], PreTrainedModel] = {}
hf_logging.disable_progress_bar()


def cache_dir() -> Path:
    return Path(os.environ.get("TESTBED_CACHE", Path.home() / ".cache" / "disagg-testbed"))


def tiny_qwen2_config(cfg: RunnerConfig) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=65536,
        tie_word_embeddings=False,
        use_sliding_window=False,
    )


def model_dir(cfg: RunnerConfig) -> Path:
    """Where the runner's weights live: the user's directory, or the cache entry for this tiny config."""
    if cfg.model_path:
        return Path(cfg.model_path)
    key = json.dumps(
        [
            cfg.hidden_size,
            cfg.num_layers,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.intermediate_size,
            cfg.vocab_size,
            cfg.weights_seed,
        ]
    )
    return cache_dir() / f"tiny-qwen2-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def ensure_model(cfg: RunnerConfig) -> Path:
    path = model_dir(cfg)
    if (path / "config.json").exists() or cfg.model_path:
        return path
    torch.manual_seed(cfg.weights_seed)
    model = AutoModelForCausalLM.from_config(tiny_qwen2_config(cfg), dtype=torch.float32)
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
