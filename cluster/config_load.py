"""The configuration edge: presets, YAML files and `--set` overrides become validated `TestbedConfig`s.

Every problem ends as one `ConfigError` line naming the field, the value given and what is allowed.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from actors.engine.runner_arch import UnsupportedModelError, check_runner_model
from emulation.config import PoolConfig, TestbedConfig
from emulation.kv_cache import cdiv, num_gpu_blocks
from emulation.profiles import GPUS, LINKS, MODELS
from workloads.slo import SloError, parse_slo
from workloads.traces.multi_turn import parse_dist

PRESETS_DIR = Path(__file__).parent / "presets"
_ADAPTER = TypeAdapter(TestbedConfig)


class ConfigError(ValueError):
    """A configuration problem, worded for the user in one line."""


def available_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def load_designs(
    source: str, designs: list[str] | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> list[TestbedConfig]:
    """Resolve a preset name or YAML path into one validated config per design.

    A source is either `{base: {...}, designs: {name: {...}}}` or one flat config. `overrides` are
    `dotted.key=value` strings applied to every design after its own settings.
    """
    raw = _read_source(source)
    if "designs" in raw:
        base = raw.get("base") or {}
        all_designs = raw["designs"] or {}
        if not isinstance(all_designs, dict) or not all_designs:
            raise ConfigError(f"designs: {source} must map design names to settings")
    else:
        base, all_designs = raw, {str(raw.get("design", "default")): {}}
    names = designs or list(all_designs)
    for name in names:
        if name not in all_designs:
            raise ConfigError(f"design: {name!r} is not in {source}; allowed: {', '.join(all_designs)}")
    configs = []
    for name in names:
        merged = _deep_merge(copy.deepcopy(base), all_designs[name] or {})
        merged["design"] = name
        for text in overrides:
            apply_override(merged, text)
        configs.append(build_config(merged))
    return configs


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
    try:
        cfg = _ADAPTER.validate_python(raw)
    except ValidationError as e:
        raise ConfigError(_describe(e)) from None
    _check_semantics(cfg)
    return cfg


def config_to_dict(cfg: TestbedConfig) -> dict[str, Any]:
    d = dataclasses.asdict(cfg)
    d["slos"] = list(cfg.slos)
    return d


def dump_config(cfg: TestbedConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


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
        raise ConfigError(f"config: {source} is not valid YAML: {str(e).splitlines()[0]}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"config: {source} must hold a mapping, not {type(raw).__name__}")
    return raw


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_merge(base[k], v)
        else:
            base[k] = v
    return base


def _fields_at(parts: list[str]) -> list[str] | None:
    """Field names of the section reached by `parts`, or None when `parts` ends at a leaf."""
    cls: Any = TestbedConfig
    for part in parts:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if part not in fields:
            raise KeyError(part)
        cls = fields[part].type
        cls = _resolve(cls)
        if not dataclasses.is_dataclass(cls):
            return None
    return [f.name for f in dataclasses.fields(cls)]


def _resolve(annotation: Any) -> Any:
    if isinstance(annotation, str):
        from emulation import config as module

        return getattr(module, annotation, annotation)
    return annotation


def _check_path(parts: list[str], text: str) -> None:
    for i in range(len(parts)):
        try:
            _fields_at(parts[: i + 1])
        except KeyError:
            allowed = _fields_at(parts[:i]) or []
            where = ".".join(parts[:i]) or "the top level"
            raise ConfigError(
                f"--set: {'.'.join(parts[: i + 1])!r} in {text!r} is not a field; "
                f"allowed at {where}: {', '.join(allowed)}"
            ) from None


def _describe(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = [str(p) for p in err["loc"]]
    key = ".".join(loc)
    if err["type"] == "extra_forbidden":
        try:
            allowed = _fields_at(loc[:-1]) or []
        except KeyError:
            allowed = []
        return f"config: {key!r} is not a field; allowed: {', '.join(allowed)}"
    return f"config: {key}={err.get('input')!r}: {err['msg']}"


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_named(kind: str, key: str, value: str, table: dict[str, Any]) -> None:
    _require(value in table, f"{key}={value!r}: unknown {kind}; allowed: {', '.join(table)}")


def _check_semantics(cfg: TestbedConfig) -> None:
    """What the schema cannot say: names from the profiles, ranges, and how sections fit together."""
    checks = (
        _check_target,
        _check_scheduler,
        _check_pools,
        _check_workload,
        _check_replay,
        _check_multi_turn,
    )
    for check in (*checks, _check_runner, _check_rest, _check_faults):
        check(cfg)


def _check_target(cfg: TestbedConfig) -> None:
    t = cfg.target
    _check_named("model", "target.model", t.model, MODELS)
    for key, value in (
        ("eta_compute", t.eta_compute),
        ("eta_bandwidth", t.eta_bandwidth),
        ("gpu_memory_utilization", t.gpu_memory_utilization),
    ):
        _require(0 < value <= 1, f"target.{key}={value}: must be in (0, 1]")
    _require(t.step_overhead_s >= 0, f"target.step_overhead_s={t.step_overhead_s}: must be >= 0")
    for key, value in dataclasses.asdict(t.operators).items():
        _require(0 < value <= 1, f"target.operators.{key}={value}: must be in (0, 1]")
    for key, value in dataclasses.asdict(t.cpu_overhead).items():
        _require(value >= 0, f"target.cpu_overhead.{key}={value}: must be >= 0 (seconds)")


def _check_scheduler(cfg: TestbedConfig) -> None:
    s, w = cfg.scheduler, cfg.workload
    _require(s.block_size > 0, f"scheduler.block_size={s.block_size}: must be > 0")
    _require(
        s.max_num_batched_tokens >= s.block_size,
        f"scheduler.max_num_batched_tokens={s.max_num_batched_tokens}: "
        f"must be >= block_size ({s.block_size})",
    )
    _require(s.max_num_seqs >= 1, f"scheduler.max_num_seqs={s.max_num_seqs}: must be >= 1")
    _require(
        s.max_model_len >= w.prompt_len + w.output_len,
        f"scheduler.max_model_len={s.max_model_len}: the workload's requests need "
        f"{w.prompt_len + w.output_len} tokens (prompt_len + output_len); allowed: at least that",
    )
    _require(
        s.num_gpu_blocks_override is None or s.num_gpu_blocks_override > 0,
        f"scheduler.num_gpu_blocks_override={s.num_gpu_blocks_override}: must be > 0",
    )
    _require(
        s.max_waiting is None or s.max_waiting >= 1,
        f"scheduler.max_waiting={s.max_waiting}: must be >= 1 (or null: no admission limit)",
    )
    _require(
        s.max_queue_time_s is None or s.max_queue_time_s > 0,
        f"scheduler.max_queue_time_s={s.max_queue_time_s}: must be > 0 (emulated seconds; null: no budget)",
    )


def _check_pools(cfg: TestbedConfig) -> None:
    t, s, w, p = cfg.target, cfg.scheduler, cfg.workload, cfg.pools
    pools: dict[str, PoolConfig] = {"mixed": p.mixed, "prefill": p.prefill, "decode": p.decode}
    for name, pool in pools.items():
        _require(pool.replicas >= 0, f"pools.{name}.replicas={pool.replicas}: must be >= 0")
        _require(pool.tp >= 1, f"pools.{name}.tp={pool.tp}: must be >= 1")
        if pool.replicas:
            _check_named("GPU", f"pools.{name}.gpu", pool.gpu, GPUS)
            need = cdiv(w.prompt_len + w.output_len, s.block_size)
            have = num_gpu_blocks(cfg, pool)
            _require(
                have >= need,
                f"pools.{name}: {t.model} on {pool.tp} x {pool.gpu} leaves KV room for {have} blocks, "
                f"a request needs {need}; allowed: a larger tp or GPU, or shorter requests",
            )
            # As vLLM refuses at start-up: a request of max_model_len tokens must fit in the KV cache
            # (else one could wait for blocks that never come free).
            key = "scheduler.num_gpu_blocks_override" if s.num_gpu_blocks_override else f"pools.{name}"
            _require(
                have * s.block_size >= s.max_model_len,
                f"{key}: {have} blocks of {s.block_size} hold {have * s.block_size} tokens of KV, less "
                f"than scheduler.max_model_len={s.max_model_len}; allowed: at least "
                f"{cdiv(s.max_model_len, s.block_size)} blocks, or a smaller max_model_len",
            )
    collocated = p.mixed.replicas > 0 and p.prefill.replicas == 0 and p.decode.replicas == 0
    disagg = p.mixed.replicas == 0 and p.prefill.replicas > 0 and p.decode.replicas > 0
    _require(
        collocated or disagg,
        f"pools: mixed={p.mixed.replicas}, prefill={p.prefill.replicas}, decode={p.decode.replicas}; "
        "allowed: mixed > 0 alone (collocated) or prefill > 0 and decode > 0 with mixed = 0 (P/D)",
    )
    e = p.encoder
    _require(
        e.replicas >= 0 and e.tp >= 1, f"pools.encoder: replicas={e.replicas}, tp={e.tp}: allowed >= 0, >= 1"
    )
    if e.replicas:
        _check_named("GPU", "pools.encoder.gpu", e.gpu, GPUS)
        vl = ", ".join(n for n, m in MODELS.items() if m.vision_encoder)
        _require(
            MODELS[t.model].vision_encoder is not None,
            f"pools.encoder.replicas={e.replicas}: target.model={t.model!r} has no vision encoder; "
            f"allowed: a vision-language model ({vl})",
        )


def _check_workload(cfg: TestbedConfig) -> None:
    w = cfg.workload
    _require(w.rate > 0, f"workload.rate={w.rate}: must be > 0 requests/s")
    _require(w.num_requests >= 1, f"workload.num_requests={w.num_requests}: must be >= 1")
    _require(w.prompt_len >= 1, f"workload.prompt_len={w.prompt_len}: must be >= 1")
    _require(w.output_len >= 1, f"workload.output_len={w.output_len}: must be >= 1")
    _require(w.image_tokens >= 1, f"workload.image_tokens={w.image_tokens}: must be >= 1")
    for key in ("text_only_fraction", "image_reuse"):
        value = getattr(w, key)
        _require(0 <= value <= 1, f"workload.{key}={value}: must be in [0, 1]")
    try:
        parse_dist(w.images_per_request)
    except ValueError as e:
        raise ConfigError(f"workload.images_per_request={e}") from None
    _require(
        w.kind != "synthetic"
        or w.images_per_request == "constant:0"
        or MODELS[cfg.target.model].vision_encoder is not None,
        f"workload.images_per_request={w.images_per_request!r}: target.model={cfg.target.model!r} has no "
        "vision encoder; allowed: a vision-language model (e.g. qwen2.5-vl-7b), or constant:0",
    )
    _require(
        not (w.output_policy == "greedy" and cfg.runner.compute == "skip"),
        "workload.output_policy='greedy': needs real logits; allowed with runner.compute='real' only",
    )
    for text in cfg.slos:
        try:
            parse_slo(text)
        except SloError as e:
            raise ConfigError(str(e)) from None


def _check_replay(cfg: TestbedConfig) -> None:
    r, router = cfg.replay, cfg.router
    if cfg.workload.kind == "trace":
        _require(r.trace is not None, "workload.kind='trace': needs replay.trace (a trace file or directory)")
    if r.trace is not None:
        _require(Path(r.trace).exists(), f"replay.trace={r.trace!r}: no such file or directory")
    _require(r.speedup > 0, f"replay.speedup={r.speedup}: must be > 0")
    _require(r.api_time_scale >= 0, f"replay.api_time_scale={r.api_time_scale}: must be >= 0")
    if r.window_s is not None:
        start, end = r.window_s
        _require(
            0 <= start < end,
            f"replay.window_s={list(r.window_s)}: must be [start, end) with 0 <= start < end",
        )
    for key in ("max_sessions", "max_turns"):
        value = getattr(r, key)
        _require(value is None or value >= 1, f"replay.{key}={value}: must be >= 1")
    _require(
        r.harness_edit == "none" or r.history == "model",
        f"replay.harness_edit={r.harness_edit!r}: edits the server's answers, needs replay.history=model",
    )
    for i, tool in enumerate(r.tools or ()):
        fn = tool.get("function")
        _require(
            tool.get("type", "function") == "function"
            and isinstance(fn, dict)
            and isinstance(fn.get("name"), str),
            f"replay.tools[{i}]={tool!r}: expected {{type: function, function: {{name: NAME, ...}}}}",
        )
    _require(router.overlap_weight >= 0, f"router.overlap_weight={router.overlap_weight}: must be >= 0")
    _require(router.temperature >= 0, f"router.temperature={router.temperature}: must be >= 0")
    _require(router.estimate_ttl_s > 0, f"router.estimate_ttl_s={router.estimate_ttl_s}: must be > 0")
    _require(
        router.max_prefill_retries >= 0,
        f"router.max_prefill_retries={router.max_prefill_retries}: must be >= 0",
    )
    timeout = router.prefill_timeout_s
    _require(
        timeout is None or timeout > 0,
        f"router.prefill_timeout_s={timeout}: must be > 0 (emulated seconds; or null: wait for ever)",
    )


def _check_multi_turn(cfg: TestbedConfig) -> None:
    m = cfg.multi_turn
    _require(m.num_conversations >= 1, f"multi_turn.num_conversations={m.num_conversations}: must be >= 1")
    _require(
        m.common_prefix_tokens >= 0, f"multi_turn.common_prefix_tokens={m.common_prefix_tokens}: must be >= 0"
    )
    _require(m.conversation_rate > 0, f"multi_turn.conversation_rate={m.conversation_rate}: must be > 0")
    for key in ("strip_answer_tokens", "rewrite_answer_tokens"):
        value = getattr(m, key)
        _require(value >= 0, f"multi_turn.{key}={value}: must be >= 0")
        _require(
            value == 0 or m.history == "model",
            f"multi_turn.{key}={value}: edits the model's answers, needs multi_turn.history=model",
        )
    for key in ("num_turns", "prefix_tokens", "user_tokens", "output_tokens", "think_s"):
        try:
            parse_dist(getattr(m, key))
        except ValueError as e:
            raise ConfigError(f"multi_turn.{key}={e}") from None


def _check_runner(cfg: TestbedConfig) -> None:
    r = cfg.runner
    for key in (
        "hidden_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "intermediate_size",
        "vocab_size",
        "num_threads",
    ):
        value = getattr(r, key)
        _require(value >= 1, f"runner.{key}={value}: must be >= 1")
    _require(
        r.hidden_size % r.num_heads == 0,
        f"runner.hidden_size={r.hidden_size}: must be a multiple of num_heads ({r.num_heads})",
    )
    _require(
        r.num_heads % r.num_kv_heads == 0,
        f"runner.num_kv_heads={r.num_kv_heads}: must divide num_heads ({r.num_heads})",
    )
    if r.model_path is not None:
        try:
            check_runner_model(r.model_path)
        except UnsupportedModelError as e:
            raise ConfigError(str(e)) from None


def _check_rest(cfg: TestbedConfig) -> None:
    kv = cfg.kv_transfer
    _check_named("link", "kv_transfer.link", kv.link, LINKS)
    _check_named("link", "ec_transfer.link", cfg.ec_transfer.link, LINKS)
    _require(kv.hold_timeout_s > 0, f"kv_transfer.hold_timeout_s={kv.hold_timeout_s}: must be > 0")
    _require(
        kv.mode == "push" or not kv.layerwise,
        "kv_transfer.layerwise=True: allowed with kv_transfer.mode='push' only",
    )
    _require(
        kv.mode == "pull" or not kv.bidirectional,
        "kv_transfer.bidirectional=True: allowed with kv_transfer.mode='pull' only",
    )
    _require(
        cfg.scheduler.enable_prefix_caching or not kv.bidirectional,
        "kv_transfer.bidirectional=True: needs scheduler.enable_prefix_caching=True (matched by hash)",
    )
    _require(
        kv.decoder_kv_blocks_ttl_s > 0,
        f"kv_transfer.decoder_kv_blocks_ttl_s={kv.decoder_kv_blocks_ttl_s}: must be > 0",
    )
    _require(cfg.render.replicas >= 1, f"render.replicas={cfg.render.replicas}: must be >= 1")
    for key in ("s_per_call", "s_per_prompt_token", "s_per_image", "s_per_image_pixel"):
        value = getattr(cfg.render, key)
        _require(value >= 0, f"render.{key}={value}: must be >= 0 (seconds)")
    for key in ("tokenizer_path", "chat_template_path"):
        path = getattr(cfg.render, key)
        _require(path is None or Path(path).exists(), f"render.{key}={path!r}: no such file or directory")
    _require(cfg.metrics.linger_s >= 0, f"metrics.linger_s={cfg.metrics.linger_s}: must be >= 0")
    ts = cfg.clock.time_scale
    _require(ts == "auto" or ts > 0, f"clock.time_scale={ts}: must be > 0 or 'auto'")
    flush = cfg.clock.stream_flush_wall_s
    _require(
        flush is None or flush >= 0,
        f"clock.stream_flush_wall_s={flush}: must be >= 0 seconds (0: every step's tokens) or null",
    )
    bound = cfg.clock.max_sync_uncertainty_s
    _require(bound > 0, f"clock.max_sync_uncertainty_s={bound}: must be > 0 (wall seconds)")


def _check_faults(cfg: TestbedConfig) -> None:
    f, p = cfg.faults, cfg.pools
    rate = f.kv_transfer_failure_rate
    _require(0 <= rate <= 1, f"faults.kv_transfer_failure_rate={rate}: must be in [0, 1] (a probability)")
    for n in f.kv_transfer_failures:
        _require(n >= 1, f"faults.kv_transfer_failures: {n}: must be >= 1 (the Nth load, from 1)")
    engines = p.engine_ids()
    for w in f.link_slowdowns:
        _require(
            0 <= w.start_s < w.end_s and w.bandwidth_factor > 0,
            f"faults.link_slowdowns: start_s={w.start_s}, end_s={w.end_s}, bandwidth_factor="
            f"{w.bandwidth_factor}; allowed: 0 <= start_s < end_s (emulated seconds), bandwidth_factor > 0",
        )
    prefill = [e for e in engines if e.startswith("prefill-")]
    for kind, allowed in (("engine_kills", engines), ("engine_hangs", prefill)):
        for fault in getattr(f, kind):
            _require(
                fault.engine in allowed,
                f"faults.{kind}: engine={fault.engine!r}: no such {'prefill ' * (kind == 'engine_hangs')}"
                f"engine; allowed: {', '.join(allowed) or 'none'}",
            )
            _require(fault.at_s >= 0, f"faults.{kind}: at_s={fault.at_s}: must be >= 0 (emulated seconds)")
    for at_s in f.proxy_kills:
        _require(at_s >= 0, f"faults.proxy_kills: {at_s}: must be >= 0 (emulated seconds)")
    _require(
        not f.engine_hangs or cfg.router.prefill_timeout_s is not None,
        "faults.engine_hangs: a hung prefill engine holds its requests for ever without "
        "router.prefill_timeout_s; allowed: set it (emulated seconds)",
    )
