"""GPUs read from aiconfigurator-core's system files, and what a machine without the package gets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from emulation.profiles import GPUS, HAND_TYPED_GPUS
from emulation.silicon_systems import SYSTEM_NAMES, gpu_from_system, package_dir

ROOT = package_dir()
needs_package = pytest.mark.skipif(ROOT is None, reason="aiconfigurator-core is not installed")


@needs_package
def test_every_system_the_package_ships_is_a_gpu_name():
    assert ROOT is not None
    shipped = {p.stem for p in (ROOT / "systems").glob("*.yaml") if "gpu" in yaml.safe_load(p.read_text())}
    assert shipped == set(SYSTEM_NAMES)
    assert set(SYSTEM_NAMES) <= set(GPUS)


@needs_package
def test_a_systems_figures_are_read_in_the_profiles_units():
    h100, gb200 = GPUS["h100_sxm"], GPUS["gb200"]
    assert (h100.peak_tflops, h100.peak_fp8_tflops, h100.peak_fp4_tflops) == (989.0, 1978.0, None)
    assert (h100.memory_bw_gbs, round(h100.memory_gb, 1), h100.tp_link_gbs) == (3350.0, 85.9, 450.0)
    assert (h100.sm_version, h100.gpus_per_node, h100.scale_out_gbs, h100.host_link) == (
        90,
        8,
        50.0,
        "pcie5-host",
    )
    assert GPUS["a100_sxm"].peak_fp8_tflops is None  # no FP8 tensor cores: FP8 runs weight-only
    # an NVL72 rack: NVLink joins its 72 GPUs; between racks, inter_rack_bw
    assert (gb200.gpus_per_node, gb200.tp_link_gbs, gb200.scale_out_gbs, gb200.peak_fp4_tflops) == (
        72, 900.0, 100.0, 10000.0)  # fmt: skip
    assert GPUS["b200_sxm"].host_link == "pcie6-host"


@needs_package
def test_the_hand_typed_l40s_kept_under_its_name_agrees_with_the_packages_but_for_memory():
    assert ROOT is not None
    theirs = gpu_from_system("l40s", yaml.safe_load((ROOT / "systems" / "l40s.yaml").read_text()))
    ours = HAND_TYPED_GPUS["l40s"]
    assert GPUS["l40s"] is ours
    assert (theirs.memory_bw_gbs, theirs.peak_fp8_tflops, theirs.tp_link_gbs, theirs.scale_out_gbs) == (
        ours.memory_bw_gbs, ours.peak_fp8_tflops, ours.tp_link_gbs, ours.scale_out_gbs)  # fmt: skip
    assert theirs.peak_tflops == pytest.approx(ours.peak_tflops, rel=2e-4)
    assert (round(theirs.memory_gb, 1), ours.memory_gb) == (48.3, 48.0)


HIDE_PACKAGE = """
import importlib.util, sys
find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name == "aiconfigurator_core" else find_spec(name, *a)
from cluster.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    ("sets", "code", "words"),
    [
        ([], 0, None),
        (["pools.mixed.gpu=h100_sxm"], 2, "unknown GPU; allowed: l40s, h100-sxm"),
        (
            ["target.model=deepseek-ai/DeepSeek-R1"],
            2,
            "Hugging Face ids are looked up in aiconfigurator-core's",
        ),
    ],
)
def test_without_the_package_built_in_names_run_and_the_others_say_what_is_missing(
    tmp_path, sets, code, words
):
    argv = ["run", "--preset", "guide-l40s", "--design", "collocated", "--compute", "skip",
            "--num-requests", "2", "--out", str(tmp_path)]  # fmt: skip
    for s in sets:
        argv += ["--set", s]
    done = subprocess.run([sys.executable, "-c", HIDE_PACKAGE, *argv], capture_output=True, text=True,
                          cwd=Path(__file__).parents[1], timeout=300)  # fmt: skip
    assert done.returncode == code, done.stderr
    if words:
        (line,) = done.stderr.strip().splitlines()
        assert (
            words in line
            and "aiconfigurator-core is not installed (pip install aiconfigurator-core==0.12.0" in line
        )
