"""The configuration edge: presets, YAML files and `--set` overrides become validated `TestbedConfig`s.

Every problem ends as one `ConfigError` line naming the field, the value given and what is allowed.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from cluster.config_rules import violations
from cluster.config_rules_hybrid import engine_pools, resolve_block_size
from cluster.engine_defaults import resolve_engine_defaults
from cluster.time_model_default import resolve_cpu_overhead, resolve_time_model
from emulation.config import TestbedConfig
from emulation.config.errors import describe, fields_at
from emulation.profiles import GPUS
from emulation.quantization import gemm_compute

PRESETS_DIR = Path(__file__).parent / "presets"
_ADAPTER = TypeAdapter(TestbedConfig)


class ConfigError(ValueError):
    """A configuration problem, worded for the user in one line."""


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def preset_designs() -> dict[str, tuple[str, list[str]]]:
    """Each preset -> what it emulates (its first comment line) and its designs."""
    out = {}
    for name in available_presets():
        lines = (PRESETS_DIR / f"{name}.yaml").read_text().splitlines()
        comment = " ".join(line.removeprefix("#").strip() for line in itertools.takewhile(_is_comment, lines))
        about = comment.split(". ")[0].removesuffix(".")  # its first sentence
        raw = _read_source(name)
        designs = list(raw["designs"]) if "designs" in raw else [str(raw.get("design", "default"))]
        out[name] = (about, designs)
    return out


def load_designs(
    source: str, designs: list[str] | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> list[TestbedConfig]:
    """Resolve a preset name or YAML path into one validated config per design.

    A source is either `{base: {...}, designs: {name: {...}}}` or one flat config. `overrides` are
    `dotted.key=value` strings applied to every design after its own settings.
    """
    return [build_config(merged) for merged in _merged_designs(source, designs, overrides)]


def needs_trace(
    source: str, designs: list[str] | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> bool:
    """Whether a design of `source` (those named, or all; with `overrides`) replays a trace it does not
    name: what only `testbed replay --trace FILE` runs."""
    for merged in _merged_designs(source, designs, overrides):
        workload, replay = merged.get("workload"), merged.get("replay")
        kind = workload.get("kind") if isinstance(workload, dict) else None
        if kind == "trace" and not (isinstance(replay, dict) and replay.get("trace")):
            return True
    return False


def _merged_designs(
    source: str, designs: list[str] | None, overrides: list[str] | tuple[str, ...]
) -> list[dict[str, Any]]:
    """Each design's raw settings: the base, the design's own, then `overrides` (not yet validated)."""
    raw = _read_source(source)
    if "designs" in raw:
        base = raw.get("base") or {}
        all_designs = raw["designs"] or {}
        if not isinstance(all_designs, dict) or not all_designs:
            raise ConfigError(f"designs: {source} must map design names to settings")
    else:
        base = raw
        all_designs = {str(raw.get("design", "default")): {}}
    names = designs or list(all_designs)
    for name in names:
        if name not in all_designs:
            raise ConfigError(f"design: {name!r} is not in {source}; allowed: {', '.join(all_designs)}")
    out = []
    for name in names:
        merged = _deep_merge(copy.deepcopy(base), all_designs[name] or {})
        merged["design"] = name
        for text in overrides:
            apply_override(merged, text)
        out.append(merged)
    return out


def apply_override(raw: dict[str, Any], text: str) -> None:
    """Apply `a.b.c=value` to a raw config dict; the value is parsed as YAML (`512`, `true`, `[1, 2]`)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set: {text!r} is malformed; expected dotted.key=value, e.g. workload.rate=0.4")
    parts = key.split(".")
    _check_path(parts, text)
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set: {key} goes through a value that is not a section")
    try:
        node[parts[-1]] = yaml.safe_load(value)
    except yaml.YAMLError as e:
        raise ConfigError(
            f"--set: value {value!r} of {key} is not valid YAML ({e.__class__.__name__})"
        ) from e


def build_config(raw: dict[str, Any]) -> TestbedConfig:
    """Validate a raw config: each field against its own bounds, the engine settings left unset at
    vLLM's defaults for the GPU, a hybrid target's block size raised (unless set), the time model
    (unless named: `cluster.time_model_default`) and its CPU time a step (unless set), then the rules
    relating fields."""
    try:
        cfg = _ADAPTER.validate_python(raw)
    except ValidationError as e:
        raise ConfigError(describe(TestbedConfig, e)) from None
    scheduler, target = raw.get("scheduler"), raw.get("target")
    configured = set(scheduler) if isinstance(scheduler, dict) else set()
    named_time_model = isinstance(target, dict) and "time_model" in target
    cpu = target.get("cpu_overhead") if isinstance(target, dict) else None
    named_s_per_step = isinstance(cpu, dict) and "s_per_step" in cpu
    for resolve in (
        lambda c: resolve_engine_defaults(c, configured),
        lambda c: resolve_block_size(c, configured="block_size" in configured),
        lambda c: resolve_time_model(c, configured=named_time_model),
        lambda c: resolve_cpu_overhead(c, configured=named_s_per_step),
    ):
        resolved = resolve(cfg)
        if isinstance(resolved, str):
            raise ConfigError(resolved)
        cfg = resolved
    problem = next(violations(cfg), None)
    if problem is not None:
        raise ConfigError(problem)
    return cfg


def config_to_dict(cfg: TestbedConfig) -> dict[str, Any]:
    d = dataclasses.asdict(cfg)
    d["slos"] = list(cfg.slos)
    return d


def dump_config(cfg: TestbedConfig, path: Path) -> None:
    """`cfg` as YAML that loads back as it is, after a commented header of what its names resolved to
    (`resolved_target`): the model's geometry and formats, each pool's GPU and its source."""
    header = yaml.safe_dump(resolved_target(cfg), sort_keys=False)
    commented = "".join(f"# {line}\n" for line in header.splitlines())
    path.write_text(commented + yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def resolved_target(cfg: TestbedConfig) -> dict[str, Any]:
    """What `cfg.target` and the pools' GPUs resolved to: the model's geometry and quantization as the
    time models read them, its parameter and byte counts, and each engine pool's GPU figures."""
    m = cfg.target.profile
    profile = {k: v for k, v in dataclasses.asdict(m).items() if v is not None}
    counts = {
        "num_params": m.num_params,
        "num_active_layer_params": m.num_active_layer_params,
        "weight_bytes": m.weight_bytes,
        "kv_bytes_per_token": m.kv_bytes_per_token,
    }
    gpus = {
        f"pools.{name}": {
            "gpus": pool.num_gpus,
            **{k: v for k, v in dataclasses.asdict(GPUS[pool.gpu]).items() if v is not None},
            "gemm_tensor_cores": {
                "layers": gemm_compute(m.weight_format, GPUS[pool.gpu], "linear"),
                "experts": gemm_compute(m.expert_format, GPUS[pool.gpu], "moe"),
            },
        }
        for name, pool in engine_pools(cfg)
    }
    return {"resolved_target": {"model_profile": {**profile, **counts}, **gpus, "chunked_prefill": True}}


def _read_source(source: str) -> dict[str, Any]:
    path = Path(source)
    if not path.suffix and not path.exists():
        path = PRESETS_DIR / f"{source}.yaml"
        if not path.exists():
            raise ConfigError(
                f"preset: {source!r} is unknown; allowed: {', '.join(available_presets())} or a YAML path"
            )
    elif not path.exists():
        raise ConfigError(f"config: file {source!r} does not exist")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(_yaml_problem(source, e)) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config: {source} must hold a mapping, not {type(raw).__name__}")
    return raw


def _yaml_problem(source: str, e: yaml.YAMLError) -> str:
    """A YAML error in one line: `FILE:LINE:COLUMN: not valid YAML: problem (context at LINE:COLUMN)`."""
    mark = getattr(e, "problem_mark", None)
    if not isinstance(e, yaml.MarkedYAMLError) or mark is None:
        return f"config: {source} is not valid YAML: {str(e).splitlines()[0]}"
    text = f"config: {source}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {e.problem}"
    if e.context:
        at = e.context_mark
        text += f" ({e.context}" + (f" at {at.line + 1}:{at.column + 1})" if at is not None else ")")
    return text


def _is_comment(line: str) -> bool:
    return line.startswith("#")


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_merge(base[k], v)
        else:
            base[k] = v
    return base


def _check_path(parts: list[str], text: str) -> None:
    for i in range(len(parts)):
        try:
            fields_at(TestbedConfig, parts[: i + 1])
        except KeyError:
            allowed = fields_at(TestbedConfig, parts[:i]) or []
            where = ".".join(parts[:i]) or "the top level"
            raise ConfigError(
                f"--set: {'.'.join(parts[: i + 1])!r} in {text!r} is not a field; "
                f"allowed at {where}: {', '.join(allowed)}"
            ) from None
