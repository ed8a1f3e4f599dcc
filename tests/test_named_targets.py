"""Targets as users name them run end to end in virtual time: models by Hugging Face id or directory,
GPUs by aiconfigurator-core's system names, formats from the checkpoint or set; each run's written
config heads with the geometry and formats it resolved to."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cluster.cli import main
from emulation.silicon_systems import package_dir

pytestmark = pytest.mark.skipif(package_dir() is None, reason="aiconfigurator-core is not installed")
EXAMPLE = Path(__file__).parents[1] / "docs" / "examples" / "deepseek-r1-fp8-h200.yaml"
SKIP = ["--compute", "skip", "--num-requests", "12"]


def _header(path: Path) -> dict:
    """The commented `resolved_target` block at the head of a written config."""
    lines = [line.removeprefix("# ") for line in path.read_text().splitlines() if line.startswith("# ")]
    return yaml.safe_load("\n".join(lines))["resolved_target"]


def _run(tmp_path: Path, argv: list[str]) -> dict[str, dict]:
    """Each design's summary of a run of `argv`, which completes every request."""
    assert main([*argv, *SKIP, "--out", str(tmp_path)]) == 0
    summaries = {s["design"]: s for s in json.loads((tmp_path / "summary.json").read_text())}
    assert all((s["completed"], s["failed"]) == (12, 0) for s in summaries.values()), summaries
    return summaries


def test_deepseek_r1_in_fp8_on_h200_at_ep8_collocated_and_pd(tmp_path):
    summaries = _run(tmp_path, ["run", "--config", str(EXAMPLE)])
    assert set(summaries) == {"collocated", "pd"}
    for design in summaries:
        resolved = _header(tmp_path / "configs" / f"{design}.yaml")
        profile = resolved["model_profile"]
        formats = (profile["weight_format"], profile["expert_format"], profile["kv_dtype_bytes"])
        assert formats == ("fp8_block", "fp8_block", 2)
        assert profile["mla"]["kv_lora_rank"] == 512 and profile["moe"]["num_experts"] == 256
        pool = resolved["pools.mixed" if design == "collocated" else "pools.decode"]
        tensor_cores = {"layers": "fp8", "experts": "fp8"}
        assert (pool["name"], pool["gpus"], pool["gemm_tensor_cores"]) == ("h200_sxm", 8, tensor_cores)


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["target.model=Qwen/Qwen3-32B", "pools.mixed.gpu=h100_sxm"], ("bf16", "bf16", 2)),
        (["target.model=openai/gpt-oss-120b", "pools.mixed.gpu=h100_sxm"], ("bf16", "mxfp4", 2)),
        (["target.model=moonshotai/Kimi-K2.5", "pools.mixed.gpu=h200_sxm", "pools.mixed.ep=8"],
         ("bf16", "int4_wo", 2)),
        (["target.model=meta-llama/Meta-Llama-3.1-70B", "pools.mixed.gpu=h100_sxm", "pools.mixed.tp=4",
          "target.quantization.weights=fp8", "target.quantization.kv_cache=fp8"], ("fp8", "fp8", 1)),
    ],
)  # fmt: skip
def test_a_shipped_model_runs_on_a_named_gpu_with_its_formats(tmp_path, sets, expected):
    argv = ["run", "--preset", "guide-l40s", "--design", "collocated", "--set", "pools.mixed.replicas=1"]
    for s in sets:
        argv += ["--set", s]
    _run(tmp_path, argv)
    profile = _header(tmp_path / "configs" / "collocated.yaml")["model_profile"]
    assert (profile["weight_format"], profile["expert_format"], profile["kv_dtype_bytes"]) == expected


def test_a_dense_model_from_a_local_directory_runs(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 3072,
                "intermediate_size": 8192,
                "num_hidden_layers": 28,
                "num_attention_heads": 24,
                "num_key_value_heads": 8,
                "vocab_size": 128256,
                "tie_word_embeddings": True,
            }
        )
    )  # fmt: skip  (Llama-3.2-3B's geometry, under no name the package ships)
    _run(
        tmp_path / "run",
        ["run", "--preset", "guide-l40s", "--design", "collocated", "--set", f"target.model={model}"],
    )
    profile = _header(tmp_path / "run" / "configs" / "collocated.yaml")["model_profile"]
    assert profile["num_layers"] == 28 and profile["num_params"] == pytest.approx(3.21e9, rel=0.01)
