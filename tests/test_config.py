"""Bad configs, from a YAML file or a raw dict, are refused in one line naming the key, the value and what
is allowed there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from actors.engine.clock import Clock
from cluster.config_load import ConfigError, build_config, load_designs
from cluster.engines import build_engine
from tests.factories import run_async


def _load(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    load_designs(str(path))


def test_a_misspelt_key_in_a_yaml_file_lists_the_keys_of_its_section(tmp_path):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, "scheduler:\n  max_num_batched_tokns: 2048\n")
    message = str(e.value)
    assert "'scheduler.max_num_batched_tokns' is not a field" in message
    assert "allowed at scheduler: max_num_batched_tokens, max_num_seqs, block_size," in message


def test_a_misspelt_section_in_a_yaml_file_lists_the_sections_not_its_contents(tmp_path):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, "schedulr:\n  max_num_batched_tokens: 2048\n")
    message = str(e.value)
    assert "'schedulr' is not a field; allowed at the top level: design, target, pools, scheduler," in message
    assert "2048" not in message


def test_a_misspelt_key_in_a_list_item_lists_the_keys_of_the_item():
    raw = {"faults": {"link_slowdowns": [{"start_s": 1, "end_s": 2, "bandwidth_factr": 0.5}]}}
    with pytest.raises(ConfigError, match=re.escape("allowed at faults.link_slowdowns[0]: start_s, end_s, ")):
        build_config(raw)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"scheduler": {"block_size": 0}}, "scheduler.block_size=0: must be > 0"),
        ({"target": {"eta_compute": 1.5}}, "target.eta_compute=1.5: must be in (0, 1]"),
        ({"workload": {"image_reuse": -0.5}}, "workload.image_reuse=-0.5: must be in [0, 1]"),
        ({"scheduler": {"max_waiting": 0}}, "scheduler.max_waiting=0: must be >= 1 or null"),
        (
            {"scheduler": {"max_num_queued_reqs": -1}},
            "scheduler.max_num_queued_reqs=-1: must be >= 0 or null",
        ),
        (
            {"scheduler": {"max_num_queued_tokens": 1.5}},
            "config: scheduler.max_num_queued_tokens=1.5: must be an integer",
        ),
        ({"clock": {"time_scale": 0}}, "clock.time_scale=0: must be > 0 or 'auto'"),
        ({"faults": {"kv_transfer_failures": [2, 0]}}, "faults.kv_transfer_failures[1]=0: must be >= 1"),
        ({"target": {"model": "gpt-5"}}, "target.model='gpt-5': unknown model; allowed: qwen2.5-7b"),
    ],
)
def test_a_value_out_of_its_fields_bounds_names_field_value_and_bounds(raw, message):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        build_config(raw)


def test_a_rule_across_fields_names_both():
    with pytest.raises(
        ConfigError, match=re.escape("kv_transfer.layerwise=True: allowed with kv_transfer.mode='push' only")
    ):
        build_config({"kv_transfer": {"layerwise": True}})
    build_config({"kv_transfer": {"layerwise": True, "mode": "push"}})


def test_the_null_block_is_counted_as_vllm_counts_it():
    """vLLM's num_gpu_blocks includes one null block no request gets: an engine of N blocks holds N - 1."""
    cfg = load_designs(
        "guide-l40s", ["collocated"], ["scheduler.num_gpu_blocks_override=2049", "workload.prompt_len=1024"]
    )[0]

    async def main():
        return build_engine("mixed-0", "mixed", cfg, cfg.pools.mixed, Clock(), None, {}, None)

    engine = run_async(main())
    assert engine.scheduler.blocks.num_blocks == 2048
    assert engine.report().num_gpu_blocks == 2049
