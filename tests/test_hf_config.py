"""Models from their config.json: every config aiconfigurator-core ships whose architecture maps is
built and checked against transformers' own model class of the same config on the meta device (total
parameters, and the active ones a token computes with: the routed experts counted from the class's
own parameters); those that do not map are refused in one line; a local directory works as an id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.config_load import ConfigError, load_designs
from emulation.hf_config import (
    ALIASES,
    SUPPORTED,
    ModelConfigError,
    checkpoint_quantization,
    language_config,
    profile_from_source,
    read_config,
)
from emulation.profiles import MODELS
from emulation.silicon_systems import package_dir

ROOT = package_dir()
pytestmark = pytest.mark.skipif(ROOT is None, reason="aiconfigurator-core is not installed")


def _shipped() -> list[str]:
    if ROOT is None:
        return []
    names = sorted(p.name for p in (ROOT / "model_configs").glob("*_config.json"))
    return [n.removesuffix("_config.json").replace("--", "/") for n in names if "_hf_quant_" not in n]


def _maps(model: str) -> bool:
    try:
        profile_from_source(model)
    except ModelConfigError:
        return False
    return True


def _transformers_knows(model: str) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = language_config(read_config(model)[0])["model_type"]
    return ALIASES.get(model_type, model_type) in CONFIG_MAPPING


SHIPPED = _shipped()
MAPPED = [m for m in SHIPPED if _maps(m)]
REFUSED = [m for m in SHIPPED if m not in MAPPED]
CHECKED = [m for m in MAPPED if _transformers_knows(m)]  # transformers knows all but MiMo


def _transformers_counts(model: str) -> tuple[int, int]:
    """(all parameters, those of routed experts) of transformers' class of `model`'s language model
    built on the meta device (multi-token-prediction layers, which vLLM runs only to speculate, left
    out). A multimodal config's text model has no causal-LM class: its base model plus the LM head."""
    import torch
    import transformers

    text = language_config(read_config(model)[0])
    model_type = ALIASES.get(text["model_type"], text["model_type"])
    values = {k: v for k, v in text.items() if k not in ("model_type", "quantization_config", "auto_map")}
    config = transformers.AutoConfig.for_model(model_type, **values)
    with torch.device("meta"):
        try:
            built = transformers.AutoModelForCausalLM.from_config(config)
            head = 0
        except ValueError:  # a multimodal model's text config (qwen3_vl_text): its text model, no head
            built = getattr(transformers, type(config).__name__.replace("Config", "Model"))(config)
            head = 0 if text["tie_word_embeddings"] else config.vocab_size * config.hidden_size
    params = [(n, p.numel()) for n, p in built.named_parameters() if "mtp" not in n]
    routed = sum(n for name, n in params if ".experts." in name)
    return sum(n for _, n in params) + head, routed


@pytest.mark.parametrize("model", CHECKED)
def test_a_shipped_config_has_the_parameters_of_transformers_class_of_it(model):
    profile = profile_from_source(model)
    counted, routed = _transformers_counts(model)
    # norms, biases and attention sinks are the difference (gpt-oss: a bias on every projection)
    assert profile.num_params == pytest.approx(counted, rel=1e-3)
    assert profile.num_routed_params == pytest.approx(routed, rel=1e-3)
    if profile.moe is not None:
        m = profile.moe
        active = counted - routed * (1 - m.num_experts_per_tok / m.num_experts)
        embeddings = 0 if profile.tie_word_embeddings else profile.num_head_params
        ours = profile.num_active_layer_params + profile.num_head_params + embeddings
        assert ours == pytest.approx(active, rel=1e-3)


def test_every_supported_architecture_has_a_shipped_config_checked():
    """Each architecture SUPPORTED lists either maps a shipped config (checked above) or has none."""
    shipped_types = {language_config(read_config(m)[0])["model_type"] for m in CHECKED}
    assert {"llama", "qwen3", "qwen3_moe", "deepseek_v3", "kimi_k2", "gpt_oss", "mixtral", "minimax_m2",
            "qwen3_5_moe_text", "qwen3_5_text", "nemotron_h", "qwen3_vl_text"} <= shipped_types  # fmt: skip
    assert shipped_types <= set(SUPPORTED)


@pytest.mark.parametrize("model", REFUSED)
def test_a_shipped_config_the_geometry_cannot_express_is_refused_in_one_line(model):
    with pytest.raises(ModelConfigError) as e:
        profile_from_source(model)
    text = str(e.value)
    assert "\n" not in text and ("not one the testbed's geometry expresses" in text or "quantization" in text)


def test_config_profiles_equal_the_hand_typed_ones_of_the_same_model():
    """DeepSeek-V3, gpt-oss-120b and Qwen3-VL-4B (its vision tower too) read from their configs are the
    built-in profiles typed from the same files (DeepSeek's head_dim, unread with MLA, aside)."""
    import dataclasses

    for shipped, built_in in (
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
        ("openai/gpt-oss-120b", "gpt-oss-120b"),
        ("Qwen/Qwen3-VL-4B-Instruct", "qwen3-vl-4b"),
    ):
        ours = dataclasses.replace(
            profile_from_source(shipped), name=built_in, head_dim=MODELS[built_in].head_dim
        )
        assert ours == MODELS[built_in]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("deepseek-ai/DeepSeek-R1", ("fp8_block", "fp8_block", "bf16")),
        ("openai/gpt-oss-120b", ("bf16", "mxfp4", "bf16")),
        ("moonshotai/Kimi-K2.5", ("bf16", "int4_wo", "bf16")),
        ("nvidia/Llama-3.1-70B-Instruct-FP8", ("fp8", "fp8", "fp8")),
        ("nvidia/Qwen3-235B-A22B-NVFP4", ("nvfp4", "nvfp4", "fp8")),
        ("nvidia/DeepSeek-V3.1-NVFP4", ("bf16", "nvfp4", "fp8")),
        ("Qwen/Qwen3-32B", ("bf16", "bf16", "bf16")),
    ],
)
def test_the_checkpoints_quantization_is_read_from_its_config(model, expected):
    assert checkpoint_quantization(*read_config(model)) == expected


def _dense_config(tmp_path: Path) -> Path:
    """A dense model shipped nowhere: Qwen2.5-14B's geometry under a made-up name."""
    config = {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 5120,
        "intermediate_size": 13824, "num_hidden_layers": 48, "num_attention_heads": 40,
        "num_key_value_heads": 8, "vocab_size": 152064, "tie_word_embeddings": False,
        "max_position_embeddings": 32768,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_a_local_directory_is_a_model(tmp_path):
    directory = _dense_config(tmp_path)
    (cfg,) = load_designs(
        "guide-l40s", ["collocated"], [f"target.model={directory}", "pools.mixed.gpu=h100_sxm"]
    )
    profile = cfg.target.profile
    assert (profile.num_layers, profile.num_kv_heads, profile.head_dim) == (48, 8, 128)
    assert profile.num_params == pytest.approx(14.77e9, rel=0.01)  # Qwen2.5-14B's model card: 14.7B


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ("no-such-model", "unknown model; allowed: qwen2.5-7b"),
        ("acme/not-shipped", "no config for that id in aiconfigurator-core's model_configs"),
        ("google/gemma-4-26B-A4B", "architecture 'gemma4_text' is not one the testbed's geometry expresses"),
    ],
)
def test_a_model_that_does_not_resolve_is_one_line_naming_it(model, words):
    with pytest.raises(ConfigError) as e:
        load_designs("guide-l40s", ["collocated"], [f"target.model={model}"])
    assert str(e.value).startswith(f"target.model={model!r}: ") and words in str(e.value)
    assert "\n" not in str(e.value)


def test_a_config_missing_a_field_names_it(tmp_path):
    """(transformers' defaults fill a field of an architecture it knows, as it would load the model;
    MiMo's it does not know)"""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mimo", "hidden_size": 64}))
    with pytest.raises(ConfigError, match="its config has no num_attention_heads"):
        load_designs("guide-l40s", ["collocated"], [f"target.model={tmp_path}"])
