"""A target model from its Hugging Face `config.json`: geometry and the checkpoint's quantization.

`target.model` names a built-in profile, a local directory or `config.json`, or a Hugging Face id whose
config ships with aiconfigurator-core (`model_configs/<org>--<name>_config.json`). Nothing is
downloaded. The config is read through transformers' own config class where transformers knows the
architecture (its defaults fill fields a config leaves out, e.g. gpt-oss's layer types) and from the
file's fields where it does not. It maps into `ModelProfile`'s geometries::

    every layer attends        GQA (num_key_value_heads x head_dim), or MLA (kv_lora_rank present)
    some layers slide          layer_types "sliding_attention" x sliding_window
    some layers are SSMs       layer_types "linear_attention" (gated delta nets), or Nemotron-H's
                               hybrid_override_pattern (M Mamba2, * attention, E MoE, - MLP)
    MLPs                       dense (intermediate_size), or MoE: routed experts (n_routed_experts,
                               num_experts, num_local_experts) x top-k, shared experts, leading or
                               listed dense layers (first_k_dense_replace, mlp_only_layers)

An architecture none of these expresses (sparse-attention indexers, latent MoE, per-layer widths) is
refused in one line naming it; `SUPPORTED` lists those that map. Multi-token-prediction layers are left
out (vLLM runs them only for speculative decoding). A vision tower is the profile's where its
vision_config is one of emulation.vision_encoders' (Qwen3-VL-4B's); otherwise the model runs text only.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from emulation.mla import MlaGeometry
from emulation.model_profile import ModelProfile
from emulation.moe import MoeGeometry
from emulation.quantization import KV_DTYPE_BYTES, WeightFormat
from emulation.silicon_systems import missing_package_line, package_dir
from emulation.ssm import GatedDeltaNetGeometry, Mamba2Geometry
from emulation.vision_encoders import VISION_ENCODERS

SUPPORTED: dict[str, str] = {
    "llama": "dense GQA",
    "mistral": "dense GQA",
    "qwen2": "dense GQA",
    "qwen3": "dense GQA",
    "mimo": "dense GQA (its MTP layers left out)",
    "qwen3_vl_text": "dense GQA (Qwen3-VL's language model; text only)",
    "mixtral": "MoE GQA",
    "qwen2_moe": "MoE GQA, a shared expert",
    "qwen3_moe": "MoE GQA",
    "qwen3_vl_moe_text": "MoE GQA (Qwen3-VL-MoE's language model; text only)",
    "minimax_m2": "MoE GQA",
    "gpt_oss": "MoE GQA, alternate sliding-window layers",
    "deepseek_v3": "MoE MLA, a shared expert, leading dense layers",
    "kimi_k2": "as deepseek_v3",
    "qwen3_next": "hybrid: gated delta nets and gated attention, MoE",
    "qwen3_5_text": "hybrid: gated delta nets and gated attention, dense",
    "qwen3_5_moe_text": "hybrid: gated delta nets and gated attention, MoE",
    "nemotron_h": "hybrid: Mamba2, attention and MoE or MLP blocks (no latent MoE)",
}
"""Each architecture (config model_type, of the language model) that maps, and how."""
ALIASES = {"kimi_k2": "deepseek_v3"}
"""Architectures transformers knows under another name (Kimi-K2 is DeepSeek-V3's)."""
HYBRID_ATTENTION_GATE = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")


class ModelConfigError(ValueError):
    """A model config that cannot be found or expressed, worded for the user in one line."""


def is_config_source(model: str) -> bool:
    """Whether `model` names a config (a path or an `org/name` id) rather than a built-in profile."""
    return "/" in model or model.endswith(".json") or Path(model).is_dir()


@functools.cache
def profile_from_source(model: str) -> ModelProfile:
    """The profile of `model` (a path or a shipped id), its quantization the checkpoint's."""
    config, hf_quant = read_config(model)
    return profile_from_config(model, config, hf_quant)


def read_config(model: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """`model`'s config.json and, where present, its hf_quant_config.json (ModelOpt's)."""
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise ModelConfigError("no config.json there")
        return _json(path), _optional_json(path.with_name("hf_quant_config.json"))
    root = package_dir()
    where = "aiconfigurator-core's model_configs"
    if root is None:
        raise ModelConfigError(
            f"not a local path, and Hugging Face ids are looked up in {where}, "
            f"but {missing_package_line()}; or pass a directory holding the model's config.json"
        )
    stem = root / "model_configs" / model.replace("/", "--")
    shipped = stem.with_name(stem.name + "_config.json")
    if not shipped.is_file():
        raise ModelConfigError(
            f"no such path, and no config for that id in {where} ({root}/model_configs;"
            " nothing is downloaded); pass a directory holding the model's config.json"
        )
    return _json(shipped), _optional_json(stem.with_name(stem.name + "_hf_quant_config.json"))


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelConfigError(f"{path} is not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{path} is not a JSON object")
    return data


def _optional_json(path: Path) -> dict[str, Any] | None:
    return _json(path) if path.is_file() else None


def language_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's fields: a multimodal config's `text_config`, else the config itself, with
    transformers' defaults where it knows the architecture."""
    text = dict(config.get("text_config") or config)
    model_type = str(text.get("model_type") or config.get("model_type"))
    text["model_type"] = model_type
    if "tie_word_embeddings" in config:  # a multimodal config keeps it at its top (Qwen3-VL)
        text.setdefault("tie_word_embeddings", config["tie_word_embeddings"])
    return {**_transformers_defaults(ALIASES.get(model_type, model_type), text), **text}


def _transformers_defaults(model_type: str, text: dict[str, Any]) -> dict[str, Any]:
    """What transformers' config class of `model_type` makes of `text` (its defaults, its derived
    layer_types); {} where transformers does not know the architecture or refuses the values."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        return {}
    values = {k: v for k, v in text.items() if k not in ("model_type", "quantization_config")}
    try:
        made = AutoConfig.for_model(model_type, **values).to_dict()
    except (TypeError, ValueError, KeyError, AttributeError):
        return {}
    return {k: v for k, v in made.items() if k not in text or text[k] is None}


def profile_from_config(
    name: str, config: Mapping[str, Any], hf_quant: Mapping[str, Any] | None = None
) -> ModelProfile:
    """`config` (a config.json's object) as a profile named `name`."""
    text = language_config(config)
    model_type = text["model_type"]
    if model_type not in SUPPORTED:
        listed = ", ".join(SUPPORTED)
        raise ModelConfigError(
            f"architecture {model_type!r} is not one the testbed's geometry expresses; supported: {listed}"
        )
    f = _Fields(text)
    weights, experts, kv = checkpoint_quantization(config, hf_quant)
    num_heads = f.int("num_attention_heads")
    hidden = f.int("hidden_size")
    layers = _layers(f, model_type)
    num_layers = sum(layers.count(mixer) for mixer in ("attention", "sliding", "ssm"))
    return ModelProfile(
        name,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=f.int("num_key_value_heads", default=num_heads),
        head_dim=f.int("head_dim", default=hidden // num_heads),
        hidden_size=hidden,
        intermediate_size=_dense_width(f, layers),
        vocab_size=f.int("vocab_size"),
        tie_word_embeddings=bool(text.get("tie_word_embeddings") or False),
        moe=_moe(f, layers),
        mla=_mla(f),
        weight_format=weights,
        expert_format=experts,
        kv_dtype_bytes=KV_DTYPE_BYTES[kv],
        sliding_window=f.int("sliding_window") if "sliding" in layers else None,
        num_sliding_layers=layers.count("sliding"),
        ssm=_ssm(f, model_type) if "ssm" in layers else None,
        num_ssm_layers=layers.count("ssm"),
        attention_output_gate=model_type in HYBRID_ATTENTION_GATE,
        vision_encoder=_vision_encoder(config.get("vision_config") or {}, hidden),
    )


def _vision_encoder(vision: Mapping[str, Any], hidden_size: int) -> str | None:
    """The known vision encoder whose geometry `vision` (a config's vision_config) gives, into a
    language model of `hidden_size` (None: none is)."""
    geometry = ("depth", "hidden_size", "intermediate_size", "num_heads", "patch_size")
    for name, vit in VISION_ENCODERS.items():
        same = all(vision.get(k) == getattr(vit, k) for k in geometry)
        if same and vision.get("out_hidden_size", hidden_size) == vit.out_hidden_size == hidden_size:
            return name
    return None


class _Fields:
    """A config's fields, each problem one line naming the field (the config edge names the model)."""

    def __init__(self, text: Mapping[str, Any]) -> None:
        self.text = text

    def int(self, *keys: str, default: int | None = None) -> int:
        for key in keys:
            value = self.text.get(key)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ModelConfigError(f"{key}={value!r} is not a count")
                return value
        if default is None:
            raise ModelConfigError(f"its config has no {' or '.join(keys)}")
        return default

    def has(self, key: str) -> bool:
        return self.text.get(key) not in (None, 0)


# A layer's kinds, in order: each token mixer ("attention", "sliding" or "ssm") followed by its MLP
# ("dense", "moe" or "none"): one list, so every count below is read off it.
def _layers(f: _Fields, model_type: str) -> list[str]:
    if model_type == "nemotron_h":
        return _nemotron_blocks(f)
    num_layers = f.int("num_hidden_layers")
    kinds = f.text.get("layer_types") or ["full_attention"] * num_layers
    mixers = {"full_attention": "attention", "sliding_attention": "sliding", "linear_attention": "ssm"}
    if len(kinds) < num_layers or any(k not in mixers for k in kinds[:num_layers]):
        raise ModelConfigError(f"layer_types {sorted(set(kinds))} not all of {list(mixers)}")
    return [x for i, kind in enumerate(kinds[:num_layers]) for x in (mixers[kind], _mlp(f, i))]


def _mlp(f: _Fields, i: int) -> str:
    """Layer i's MLP: MoE where the model has routed experts and the layer is sparse."""
    if _num_experts(f) == 0:
        return "dense"
    if i < f.int("first_k_dense_replace", default=0) or i in (f.text.get("mlp_only_layers") or []):
        return "dense"
    step = f.int("decoder_sparse_step", "moe_layer_freq", default=1)
    return "moe" if (i + 1) % max(step, 1) == 0 else "dense"


def _nemotron_blocks(f: _Fields) -> list[str]:
    """Nemotron-H's blocks (one mixer or one MLP each) as mixers each followed by an MLP or none: the
    profile counts MLP layers, not their places, so blocks are paired in order."""
    if f.has("moe_latent_size"):
        raise ModelConfigError(
            f"nemotron_h with moe_latent_size (latent MoE) is not one the "
            f"testbed's geometry expresses; supported: {', '.join(SUPPORTED)}"
        )
    pattern = str(f.text.get("hybrid_override_pattern") or "")
    if not pattern or set(pattern) - set("M*E-"):
        raise ModelConfigError(f"hybrid_override_pattern={pattern!r} is not M, *, E, - blocks")
    mixers = ["ssm" if c == "M" else "attention" for c in pattern if c in "M*"]
    mlps = ["moe" if c == "E" else "dense" for c in pattern if c in "E-"]
    mlps += ["none"] * (len(mixers) - len(mlps))
    if len(mlps) > len(mixers):
        raise ModelConfigError(f"more MLP blocks than mixers in {pattern!r}")
    return [x for pair in zip(mixers, mlps, strict=True) for x in pair]


def _num_experts(f: _Fields) -> int:
    return f.int("n_routed_experts", "num_experts", "num_local_experts", default=0)


def _dense_width(f: _Fields, layers: list[str]) -> int:
    """The dense MLP's width: 0 where the dense slots are Nemotron-H's mixers without an MLP (the
    profile counts dense MLP layers as those that are not MoE)."""
    if "none" in layers:
        if "dense" in layers:
            raise ModelConfigError(
                "nemotron_h with MLP blocks after some mixers only is not one the testbed's geometry "
                f"expresses (its MLP layers are all alike); supported: {', '.join(SUPPORTED)}"
            )
        return 0
    if "dense" not in layers:  # every layer MoE: the width is not read
        return f.int("intermediate_size", default=0)
    return f.int("intermediate_size")


def _moe(f: _Fields, layers: list[str]) -> MoeGeometry | None:
    num_experts = _num_experts(f)
    if num_experts == 0:
        return None
    expert_width = f.int("moe_intermediate_size", default=0) or f.int("intermediate_size")
    shared = f.int("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size", default=0)
    if not shared and f.has("n_shared_experts"):
        shared = f.int("n_shared_experts") * expert_width
    squared_relu = f.text.get("mlp_hidden_act") == "relu2"  # Nemotron-H: up and down only
    return MoeGeometry(
        num_experts=num_experts,
        num_experts_per_tok=f.int("num_experts_per_tok", "moe_top_k"),
        moe_intermediate_size=expert_width,
        shared_expert_intermediate_size=shared,
        num_dense_layers=layers.count("dense") + layers.count("none"),
        num_projections=2 if squared_relu else 3,
    )


def _mla(f: _Fields) -> MlaGeometry | None:
    if not f.has("kv_lora_rank"):
        return None
    return MlaGeometry(
        kv_lora_rank=f.int("kv_lora_rank"),
        qk_nope_head_dim=f.int("qk_nope_head_dim"),
        qk_rope_head_dim=f.int("qk_rope_head_dim"),
        v_head_dim=f.int("v_head_dim"),
        q_lora_rank=f.int("q_lora_rank") if f.has("q_lora_rank") else None,
    )


def _ssm(f: _Fields, model_type: str) -> Mamba2Geometry | GatedDeltaNetGeometry:
    if model_type == "nemotron_h":
        return Mamba2Geometry(
            num_heads=f.int("mamba_num_heads"),
            head_dim=f.int("mamba_head_dim"),
            n_groups=f.int("n_groups"),
            state_size=f.int("ssm_state_size"),
            conv_kernel=f.int("conv_kernel"),
            chunk_size=f.int("chunk_size"),
            ssm_dtype_bytes=4 if f.text.get("mamba_ssm_cache_dtype") == "float32" else 2,
        )
    return GatedDeltaNetGeometry(
        num_key_heads=f.int("linear_num_key_heads"),
        num_value_heads=f.int("linear_num_value_heads"),
        key_head_dim=f.int("linear_key_head_dim"),
        value_head_dim=f.int("linear_value_head_dim"),
        conv_kernel=f.int("linear_conv_kernel_dim"),
    )


_ATTENTION = re.compile(r"self_attn|\.attn\b|\battn\.|linear_attn")


def checkpoint_quantization(
    config: Mapping[str, Any], hf_quant: Mapping[str, Any] | None
) -> tuple[WeightFormat, WeightFormat, str]:
    """(layer weights, routed experts, KV cache) as the checkpoint stores them, from config.json's
    `quantization_config` (its `text_config`'s) or ModelOpt's hf_quant_config.json::

        quant_method fp8            fp8_block with weight_block_size, else fp8; experts alike
        quant_method mxfp4          experts mxfp4, the rest bf16 (gpt-oss)
        compressed-tensors groups   4-bit int: int4_wo; 4-bit float: nvfp4; 8-bit float: fp8
        ModelOpt quant_algo         FP8: fp8; NVFP4: nvfp4; kv_cache_quant_algo FP8: KV fp8

    A checkpoint that leaves its attention projections unquantized (an ignore or exclude list naming
    them) counts its non-expert layer weights as bf16; a mixed-precision one (per-layer formats) is
    refused in one line asking for target.quantization to be set."""
    text = config.get("text_config") or {}
    q = dict(config.get("quantization_config") or text.get("quantization_config") or {})
    if hf_quant:
        q = {**q, **dict(hf_quant.get("quantization") or hf_quant)}
    kv = "fp8" if _kv_fp8(q) else "bf16"
    method, algo = str(q.get("quant_method", "")), str(q.get("quant_algo") or "").upper()
    if not q or (not method and not algo):
        return "bf16", "bf16", kv
    if method == "mxfp4":
        return "bf16", "mxfp4", kv
    if method == "fp8":
        fmt: WeightFormat = "fp8_block" if q.get("weight_block_size") else "fp8"
        return fmt, fmt, kv
    if algo == "MIXED_PRECISION":
        raise ModelConfigError(
            "its checkpoint mixes formats layer by layer; set "
            "target.quantization.weights and .experts (allowed: bf16, fp8, fp8_block, nvfp4, mxfp4, int4_wo)"
        )
    by_algo: dict[str, WeightFormat] = {"FP8": "fp8", "NVFP4": "nvfp4"}
    fmt = by_algo.get(algo) or _group_format(q)
    skipped = [str(x) for x in (q.get("ignore") or q.get("exclude_modules") or [])]
    weights: WeightFormat = "bf16" if any(_ATTENTION.search(x) for x in skipped) else fmt
    return weights, fmt, kv


def _group_format(q: Mapping[str, Any]) -> WeightFormat:
    """compressed-tensors: the first config group's weights."""
    groups: Mapping[str, Any] = q.get("config_groups") or {}
    first: Mapping[str, Any] = next(iter(groups.values()), {})
    weights: Mapping[str, Any] = first.get("weights") or {}
    bits, kind = weights.get("num_bits"), weights.get("type")
    if (bits, kind) == (4, "int"):
        return "int4_wo"
    if (bits, kind) == (4, "float"):
        return "nvfp4"
    if (bits, kind) == (8, "float"):
        return "fp8"
    raise ModelConfigError(
        f"quantization {q.get('quant_method') or q.get('quant_algo')!r} with "
        f"{bits}-bit {kind} weights is not a format the testbed knows; set target.quantization "
        "(allowed: bf16, fp8, fp8_block, nvfp4, mxfp4, int4_wo)"
    )


def _kv_fp8(q: Mapping[str, Any]) -> bool:
    algo = str(q.get("kv_cache_quant_algo") or "").upper()
    scheme = q.get("kv_cache_scheme")
    if isinstance(scheme, Mapping):
        return scheme.get("num_bits") == 8 and scheme.get("type") == "float"
    return algo == "FP8" or str(scheme).upper() == "FP8"
