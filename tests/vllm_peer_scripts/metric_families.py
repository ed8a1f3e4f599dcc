"""Every Prometheus family vLLM's engine exports after some traffic: name, type, label names, buckets.

Runs with the vLLM peer's python (`tests/vllm_peer.py`); imports only vLLM and the standard library.

    python metric_families.py MODEL_DIR RUN.json  ->  stdout: one JSON object

MODEL_DIR holds the testbed's tiny Qwen2 in a shape vLLM's CPU attention serves (head_dim 32). RUN.json::

    {"max_model_len": 512, "block_size": 32, "num_gpu_blocks": 20, "max_num_seqs": 8,
     "max_num_batched_tokens": 512,
     "requests": [{"prompt_token_ids": [...], "max_tokens": 120}, ...]}

vLLM's engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, `LLM(..., disable_log_stats=False)`:
its `LLMEngine` then builds a `StatLoggerManager`, which always adds vLLM's `PrometheusStatLogger` to
`prometheus_client`'s default registry, as the API server's does; `enable_mfu_metrics` makes its flops
and bytes estimate count). The requests go in as token IDs, all at once, greedy with EOS ignored. Then
every family in the registry is read back (through `prometheus_client`, vLLM's own dependency).

KV-connector families (`vllm:nixl_*`, `vllm:num_requests_kv_fetch_by_stage`) need a connector, and NIXL
does not run here: they are read from a second `PrometheusStatLogger` that vLLM builds for the same
config with a `NixlConnector` `kv_both` transfer config, as a P/D instance has (nothing transfers; the
families, their types, labels and buckets are vLLM's own). They carry `"source": "nixl_config"`.

Output::

    {"vllm_version": "0.32.0",
     "families": {name: {"type": "counter" | "gauge" | "histogram", "labels": [sorted label names],
                         "buckets": [finite bounds] | null, "values": {label: [sorted values]},
                         "suffixes": [sorted sample name suffixes], "total": float,
                         "source": "engine" | "nixl_config"}},
     "cache_config_info": {label: value}}

`name` is the family's (a counter's without `_total`); `values` lists the values of each label other
than `model_name`, `engine` and `le` (the reasons, sources and states vLLM pre-creates);
`suffixes` what the samples add to the name (a counter's `_total` and `_created`, a histogram's
`_bucket`, `_count`, `_sum` and `_created`, a gauge's nothing); `total` sums a counter's or gauge's
samples (not `_created`), or a histogram's `_count`s (the traffic's footprint).
"""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import sys
from typing import Any

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import prometheus_client
from vllm import LLM, SamplingParams
from vllm.config import KVTransferConfig
from vllm.inputs import TokensPrompt
from vllm.v1.metrics.loggers import PrometheusStatLogger

PER_ENGINE = frozenset({"model_name", "engine", "le"})
"""Labels whose values name the engine or a bucket, not what is counted."""


def run_engine(model_dir: str, run: dict[str, Any]) -> LLM:
    """vLLM's engine in process over `model_dir`, after serving `run`'s requests."""
    llm = LLM(
        model=model_dir,
        enforce_eager=True,
        dtype="float32",
        skip_tokenizer_init=True,
        block_size=run["block_size"],
        disable_log_stats=False,
        max_model_len=run["max_model_len"],
        num_gpu_blocks_override=run["num_gpu_blocks"],
        max_num_seqs=run["max_num_seqs"],
        max_num_batched_tokens=run["max_num_batched_tokens"],
        seed=0,
        enable_mfu_metrics=True,  # vLLM's flops/bytes estimate, so that its counters count
    )
    prompts = [TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in run["requests"]]
    params = [
        SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True, temperature=0.0) for r in run["requests"]
    ]
    llm.generate(prompts, params, use_tqdm=False)
    return llm


def vllm_families(source: str) -> dict[str, dict[str, Any]]:
    """Every `vllm:` family in the default registry, as the output describes them."""
    out = {}
    for fam in prometheus_client.REGISTRY.collect():
        if not fam.name.startswith("vllm:"):
            continue
        out[fam.name] = describe(fam, source)
    return out


def other_families() -> dict[str, dict[str, Any]]:
    """The rest of the registry (the Python process's own collectors), described alike."""
    return {
        fam.name: describe(fam, "process")
        for fam in prometheus_client.REGISTRY.collect()
        if not fam.name.startswith("vllm:")
    }


def describe(fam: Any, source: str) -> dict[str, Any]:
    samples = fam.samples
    labels = sorted({k for s in samples for k in s.labels} - {"le"})
    buckets = None
    if fam.type == "histogram":
        bounds = {s.labels["le"] for s in samples if s.name.endswith("_bucket")}
        buckets = sorted(float(b) for b in bounds if b != "+Inf")
    values = {
        name: sorted({s.labels[name] for s in samples if name in s.labels})
        for name in labels
        if name not in PER_ENGINE and fam.name != "vllm:cache_config_info"
    }
    if fam.type == "histogram":
        total = sum(s.value for s in samples if s.name.endswith("_count"))
    else:
        total = sum(s.value for s in samples if not s.name.endswith("_created"))
    return {
        "type": fam.type,
        "labels": labels,
        "buckets": buckets,
        "values": values,
        "suffixes": sorted({s.name[len(fam.name) :] for s in samples}),
        "total": total,
        "source": source,
    }


def nixl_families(llm: LLM) -> dict[str, dict[str, Any]]:
    """The families a P/D instance (NIXL, `kv_both`) adds, from the stat logger vLLM builds for it."""
    config = copy.copy(llm.llm_engine.vllm_config)
    config.kv_transfer_config = KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both")
    PrometheusStatLogger(config, [0])  # unregisters the engine's families first, then registers its own
    return vllm_families("nixl_config")


def cache_config_info() -> dict[str, str]:
    for fam in prometheus_client.REGISTRY.collect():
        if fam.name == "vllm:cache_config_info":
            return dict(fam.samples[0].labels)
    raise SystemExit("vllm:cache_config_info was not exported")


def main() -> None:
    model_dir, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        run = json.load(f)
    llm = run_engine(model_dir, run)
    families = {**other_families(), **vllm_families("engine")}
    info = cache_config_info()
    for name, fam in nixl_families(llm).items():
        families.setdefault(name, fam)
    out = {
        "vllm_version": importlib.metadata.version("vllm-cpu"),
        "families": families,
        "cache_config_info": info,
    }
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
