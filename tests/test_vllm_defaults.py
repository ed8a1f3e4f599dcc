"""Engine settings left unset follow vLLM's defaults for the pools' GPU: the batch defaults against
vLLM's own `EngineArgs.get_batch_defaults` (the peer's, run in its venv), the block size by the MLA
backend vLLM picks, and the resolution at the config edge (set values kept, vLLM's clamps, pools that
disagree refused)."""

from __future__ import annotations

import json

import pytest

from cluster.config_load import ConfigError, load_designs
from emulation.profiles import GPUS, MODELS
from emulation.vllm_defaults import batch_defaults, default_block_size
from tests.vllm_peer import run_script

NAMED = {  # the device names vLLM would read (only "a100" in them matters to its rule)
    "l40s": "NVIDIA L40S", "a100-80gb": "NVIDIA A100-SXM4-80GB", "h100-sxm": "NVIDIA H100 80GB HBM3",
    "h200": "NVIDIA H200", "b200": "NVIDIA B200", "h800": "NVIDIA H800", "a100_sxm": "NVIDIA A100-SXM4-80GB",
    "a100_pcie": "NVIDIA A100 80GB PCIe", "a30": "NVIDIA A30", "h100_sxm": "NVIDIA H100 80GB HBM3",
    "h200_sxm": "NVIDIA H200", "b200_sxm": "NVIDIA B200", "b300_sxm": "NVIDIA B300", "gb200": "NVIDIA GB200",
    "l4": "NVIDIA L4", "rtx_pro_6000_server": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
}  # fmt: skip


@pytest.mark.full
@pytest.mark.parallel  # the peer's script on given devices: no port, no time
def test_batch_defaults_are_vllms_own_for_every_gpu(tmp_path):
    names = [n for n in NAMED if n in GPUS]
    devices = [{"memory_bytes": int(GPUS[n].memory_gb * 1e9), "name": NAMED[n]} for n in names]
    (tmp_path / "devices.json").write_text(json.dumps(devices))
    theirs = json.loads(run_script("batch_defaults.py", str(tmp_path / "devices.json")))
    assert {n: list(batch_defaults(GPUS[n])) for n in names} == dict(zip(names, theirs, strict=True))


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [("l40s", (2048, 256)), ("a100-80gb", (2048, 256)), ("h100-sxm", (8192, 1024)), ("h200", (8192, 1024)),
     ("b200", (16384, 1024))],
)  # fmt: skip
def test_batch_defaults_by_memory_and_name(gpu, expected):
    assert batch_defaults(GPUS[gpu]) == expected


def test_an_mla_models_block_size_is_its_backends():
    deepseek, llama = MODELS["deepseek-v3"], MODELS["llama-3.1-8b"]
    fp8_kv = __import__("dataclasses").replace(deepseek, kv_dtype_bytes=1)
    assert default_block_size(llama, GPUS["h200"]) == 16
    assert default_block_size(deepseek, GPUS["h200"]) == 16  # FlashAttention MLA
    assert default_block_size(fp8_kv, GPUS["h200"]) == 64  # FlashMLA
    assert default_block_size(deepseek, GPUS["b200"]) == 32  # FlashInfer MLA
    assert default_block_size(deepseek, GPUS["a100-80gb"]) == 16  # Triton MLA


def _one(*sets: str):
    (cfg,) = load_designs("guide-l40s", ["collocated"], ["scheduler={}", *sets])
    return cfg.scheduler


def test_unset_settings_take_the_gpus_defaults_and_set_ones_stay():
    s = _one("pools.mixed.gpu=h200")
    assert (s.max_num_batched_tokens, s.max_num_seqs, s.block_size) == (8192, 1024, 16)
    s = _one("pools.mixed.gpu=h200", "scheduler.max_num_seqs=64")
    assert (s.max_num_batched_tokens, s.max_num_seqs) == (8192, 64)
    s = _one("pools.mixed.gpu=l40s")
    assert (s.max_num_batched_tokens, s.max_num_seqs) == (2048, 256)


def test_vllms_clamps_apply_to_defaults_only():
    s = _one(
        "pools.mixed.gpu=b200", "scheduler.max_model_len=12", "workload.prompt_len=8", "workload.output_len=4"
    )
    assert (s.max_num_batched_tokens, s.max_num_seqs) == (12288, 1024)  # tokens <= seqs x max_model_len
    s = _one("pools.mixed.gpu=h200", "scheduler.max_num_batched_tokens=512")
    assert (s.max_num_batched_tokens, s.max_num_seqs) == (512, 512)  # seqs <= tokens


def test_pools_whose_gpus_vllm_gives_different_defaults_must_set_them():
    sets = ["scheduler={}", "pools.prefill.gpu=h200", "pools.decode.gpu=l40s"]
    with pytest.raises(ConfigError) as e:
        load_designs("guide-l40s", ["pd-fast"], sets)
    assert str(e.value).startswith("scheduler.max_num_batched_tokens: unset, and vLLM's defaults differ")
    (cfg,) = load_designs("guide-l40s", ["pd-fast"], [*sets, "scheduler.max_num_batched_tokens=4096",
                                                      "scheduler.max_num_seqs=256"])  # fmt: skip
    assert cfg.scheduler.max_num_batched_tokens == 4096
