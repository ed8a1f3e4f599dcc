"""Factories for tests: small configs, requests and virtual-time runs built from the real classes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from actors.engine.clock import VirtualTimeLoop
from actors.messages import ClientRequest, RequestResult
from cluster.config import TestbedConfig
from cluster.config_load import build_config
from cluster.virtual import Deployment, serve

COLLOCATED: dict[str, Any] = {"pools": {"mixed": {"replicas": 1}}}
PD: dict[str, Any] = {
    "pools": {"mixed": {"replicas": 0}, "prefill": {"replicas": 1}, "decode": {"replicas": 1}}
}


def make_config(*layers: dict[str, Any], **sections: Any) -> TestbedConfig:
    """A validated config: defaults, then each layer, then keyword sections (deep-merged)."""
    raw: dict[str, Any] = {}
    for layer in (*layers, sections):
        _merge(raw, layer)
    return build_config(raw)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> None:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v


def make_requests(
    num: int,
    prompt_len: int | Sequence[int],
    max_tokens: int,
    vocab: int = 8192,
    seed: int = 0,
    gap_s: float = 0.5,
    forced: bool = False,
) -> list[ClientRequest]:
    rng = np.random.default_rng(seed)
    lens = [prompt_len] * num if isinstance(prompt_len, int) else list(prompt_len)
    return [
        ClientRequest(
            request_id=f"r{i}",
            arrival_s=i * gap_s,
            prompt_token_ids=rng.integers(0, vocab, lens[i]).tolist(),
            max_tokens=max_tokens,
            forced_output_token_ids=rng.integers(0, vocab, max_tokens).tolist() if forced else None,
        )
        for i in range(num)
    ]


def run_requests(
    cfg: TestbedConfig, requests: Sequence[ClientRequest]
) -> tuple[list[RequestResult], Deployment]:
    """Serve `requests` on a fresh virtual deployment; engines are checked empty afterwards."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(serve(cfg, requests))
    finally:
        loop.close()


def run_async(coro: Any) -> Any:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


__all__ = ["COLLOCATED", "PD", "asyncio", "make_config", "make_requests", "run_async", "run_requests"]
