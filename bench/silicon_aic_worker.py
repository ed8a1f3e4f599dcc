"""AIConfigurator's own estimates of silicon rows: run INSIDE the aiconfigurator venv, never the project's.

    ~/.cache/disagg-testbed/aiconfigurator-0.12.0/bin/python bench/silicon_aic_worker.py < rows.json

Reads a JSON list of rows (the columns of aiconfigurator-core's `systems/silicon_sample.csv` as dicts;
missing values as null, "" or NaN) on stdin and prints one JSON object a line, in order, as each row
is done: `{"id", "aic_ttft_ms", "aic_tpot_ms", "aic_backend_version", "aic_note", "aic_wall_s"}`, or
`{"id", "aic_skipped": reason, ...}`. Imports only aiconfigurator and the standard library; started by
bench/silicon_aic.py.

Each row is estimated the way AIConfigurator scores itself against that CSV (its repository's
tools/accuracy_regression_testing/predict_silicon_sample.py): `aiconfigurator.cli.api.cli_estimate`
with model_path, system, mode, backend, backend_version, isl, osl, gemm/moe quant modes and, where the
row has them, batch_size and the tp/pp/attention_dp/moe_tp/moe_ep sizes (agg) or their prefill_/decode_
counterparts with batch_size and num_workers (disagg); everything else at cli_estimate's defaults
(SILICON database, ctx_tokens = isl), identical calls answered from a cache. Two departures, each named
in `aic_note`:

- backend version: 0.12.0 answers only its queryable version slots (aiconfigurator_core
  systems/query_versions.yaml: current, previous, next) and rejects any other version outright, which
  the tool's retry (on "Failed to load perf database") does not catch. A row whose version is not a
  slot gets the nearest slot instead (the newest not newer than the row's, else the oldest); a row
  with no version, or one that is not a number (nightly-dev, gpt-oss-dev), AIConfigurator's default.
- model: a model whose config.json aiconfigurator-core does not ship is fetched from the Hugging Face
  hub; where that fails (no network), the shipped config of the same architecture under another id
  (an Instruct model is its base model's; the row gives the quantization) is used.

`aic_note` also carries AIConfigurator's own warning where the batch exceeds its estimate of the KV
cache (it then does not model the queueing, it says, and its TTFT is not to be trusted).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import math
import re
import sys
import time
from typing import Any

PARALLEL = ("tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")
AGG_FIELDS = ("batch_size", *PARALLEL)
DISAGG_FIELDS = tuple(
    f"{s}_{f}" for s in ("prefill", "decode") for f in (*PARALLEL, "batch_size", "num_workers")
)
REQUIRED_DISAGG = ("prefill_batch_size", "prefill_num_workers", "decode_batch_size", "decode_num_workers")
MODEL_ALIASES = {
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1",
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",
    "zhipuai/GLM-5": "zai-org/GLM-5",
}
"""Ids the CSV names whose config aiconfigurator-core does not ship, and the shipped id of the same
architecture (used only when the hub cannot be reached)."""


def _missing(value: Any) -> bool:
    return value is None or value == "" or (isinstance(value, float) and math.isnan(value))


def _int(value: Any) -> int | None:
    return None if _missing(value) else int(float(value))


def _str(value: Any) -> str | None:
    return None if _missing(value) else str(value)


@functools.cache
def _slots(system: str, backend: str) -> tuple[str, ...]:
    """The versions 0.12.0 answers for (system, backend); its listing parses hundreds of YAML files."""
    from aiconfigurator_core.sdk.perf_database import get_supported_databases

    return tuple(get_supported_databases().get(system, {}).get(backend, []))


@functools.cache
def _default(system: str, backend: str) -> str | None:
    from aiconfigurator_core.sdk.perf_database import get_latest_database_version

    return get_latest_database_version(system=system, backend=backend)


def backend_version(system: str, backend: str, wanted: str | None) -> tuple[str | None, str]:
    """The database version to ask for (None: cli_estimate's own default) and, where it is not the
    row's, why."""
    from aiconfigurator_core.sdk.perf_database import _version_sort_tuple

    have = _slots(system, backend)
    if wanted in have:
        return wanted, ""
    if not have:
        return None, ""  # cli_estimate says why
    if wanted is None or not re.search(r"\d+\.\d+", wanted):
        default = _default(system, backend)
        return default, f"version {wanted or 'unset'}: default {default}"
    key = _version_sort_tuple(wanted)
    older = [v for v in have if _version_sort_tuple(v) <= key]
    pick = max(older, key=_version_sort_tuple) if older else min(have, key=_version_sort_tuple)
    return pick, f"version {wanted}: nearest {pick}"


def estimate_args(row: dict[str, Any]) -> dict[str, Any]:
    """cli_estimate's keyword arguments for `row`, as predict_silicon_sample.py builds them."""
    fields = AGG_FIELDS if row["mode"] == "agg" else DISAGG_FIELDS
    return {
        "model_path": str(row["model_path"]),
        "system_name": str(row["system"]),
        "mode": str(row["mode"]),
        "backend_name": str(row["backend"]),
        "backend_version": _str(row.get("backend_version")),
        "isl": int(float(row["isl"])),
        "osl": int(float(row["osl"])),
        "gemm_quant_mode": _str(row.get("gemm_quant_mode")),
        "moe_quant_mode": _str(row.get("moe_quant_mode")),
        **{f: _int(row.get(f)) for f in fields if not _missing(row.get(f))},  # a 0 too, as the tool
    }


_CACHE: dict[tuple[Any, ...], dict[str, Any]] = {}
_UNREACHABLE: set[str] = set()
"""Models whose config the hub did not give (tried once a process)."""


def _cli_estimate(args: dict[str, Any]) -> dict[str, Any]:
    """The estimate's means, or why there is none; AIConfigurator's own warning where the batch
    exceeds its KV cache estimate (queueing it does not model)."""
    from aiconfigurator.cli.api import cli_estimate

    with contextlib.redirect_stdout(io.StringIO()):  # its tables and banners
        result = cli_estimate(**args)
    ttft, tpot = float(result.ttft), float(result.tpot)
    if not all(math.isfinite(v) and v > 0 for v in (ttft, tpot)):
        return {"aic_skipped": f"no estimate (ttft {ttft}, tpot {tpot})"}
    warn = "aic: batch over its KV cache estimate" if getattr(result, "kv_cache_warning", None) else ""
    return {"aic_ttft_ms": ttft, "aic_tpot_ms": tpot, "warn": warn}


def _model_fails(model: str) -> bool:
    """Whether `model`'s config cannot be had (not shipped, and the hub not reachable)."""
    if model in _UNREACHABLE:
        return True
    from aiconfigurator_core.sdk.utils import get_model_config_from_model_path

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            get_model_config_from_model_path(model)
    except Exception:
        _UNREACHABLE.add(model)
        return True
    return False


TRIM = re.compile(r" (?:for \w+Key|at /|on system|with the given|\{)|, but |\. ")
"""Where an error's message turns to the row's own details (keys, paths, systems): the reason ends."""


def _reason(error: BaseException) -> str:
    """An error as a countable reason, in a few words."""
    text = re.sub(r" '[^']*/[^']*'", "", re.sub(r"\s+", " ", str(error).strip())) or type(error).__name__
    cut = TRIM.search(text)
    return (text[: cut.start()] if cut else text).rstrip(" .:,")[:100]


def estimate(row: dict[str, Any]) -> dict[str, Any]:
    """One row's estimate, or why there is none."""
    out: dict[str, Any] = {"id": row.get("id")}
    start = time.perf_counter()
    try:
        args = estimate_args(row)
    except (KeyError, TypeError, ValueError) as e:
        return {**out, "aic_skipped": f"bad row: {_reason(e)}"}
    if args["mode"] == "disagg":
        lacking = [f for f in REQUIRED_DISAGG if f not in args]
        if lacking:
            return {**out, "aic_skipped": f"disagg row without {', '.join(lacking)}"}
    elif args["mode"] != "agg":
        return {**out, "aic_skipped": f"mode {args['mode']}"}
    notes = []
    version, note = backend_version(args["system_name"], args["backend_name"], args["backend_version"])
    args["backend_version"] = version
    notes.append(note)
    model = args["model_path"]
    if model in MODEL_ALIASES and _model_fails(model):
        args["model_path"] = MODEL_ALIASES[model]
        notes.append(f"model config of {args['model_path']}")
    key = tuple(sorted(args.items()))
    if key not in _CACHE:
        try:
            _CACHE[key] = _cli_estimate(args)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # a Rust panic arrives as a BaseException
            _CACHE[key] = {"aic_skipped": _reason(e)}
    result = dict(_CACHE[key])
    notes.append(result.pop("warn", ""))
    return {
        **out,
        **result,
        "aic_backend_version": version,
        "aic_note": "; ".join(n for n in notes if n),
        "aic_wall_s": round(time.perf_counter() - start, 4),
    }


def main() -> int:
    logging.disable(logging.WARNING)  # aiconfigurator logs each estimate at INFO
    rows = json.load(sys.stdin)
    for row in rows:
        print(json.dumps(estimate(row)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
