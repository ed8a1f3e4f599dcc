"""GPUs as `aiconfigurator-core` describes them: every `systems/<name>.yaml` it ships is a GPU name.

The package (NVIDIA, Apache-2.0) carries a Rust extension built for Linux x86-64 and aarch64 and
macOS arm64 only, and nothing in it imports without that extension; its system files are plain YAML,
so they are read here straight from the installed package's folder (found without importing it).

Each file gives, per GPU and per node (units as the files write them: bytes, bytes/s, FLOP/s)::

    gpu.mem_capacity        bytes (nominal GiB: H100's 80 GiB is 85.9 GB)     -> memory_gb
    gpu.mem_bw              bytes/s                                           -> memory_bw_gbs
    gpu.bfloat16_tc_flops   dense BF16 tensor-core FLOP/s                     -> peak_tflops
    gpu.fp8_tc_flops        dense FP8 (absent on A100/A30: no FP8 cores)       -> peak_fp8_tflops
    gpu.fp4_tc_flops        dense FP4 (Blackwell)                             -> peak_fp4_tflops
    gpu.sm_version          CUDA compute capability x 10                      -> sm_version
    node.intra_node_bw      per GPU, one direction, scale-up link             -> tp_link_gbs
    node.inter_node_bw      per GPU, one direction, between nodes             -> scale_out_gbs
    node.num_gpus_per_node  GPUs one scale-up link joins                      -> gpus_per_node
    node.pcie_bw            one direction, to the host                        -> host_link
    (GB200/GB300: num_gpus_per_rack share NVLink; between racks, inter_rack_bw)

What the files do not give stays at `GpuProfile`'s defaults, which say they are assumed: L2 size,
host memory per GPU, all-reduce call latency.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import yaml

from emulation.gpu_profile import GpuProfile

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's: 14 files in ~20 ms, not ~300
PACKAGE = "aiconfigurator-core"
PACKAGE_VERSION = "0.12.0"
SYSTEM_NAMES = (
    "a100_pcie", "a100_sxm", "a30", "b200_sxm", "b300_sxm", "b60", "gb200", "gb300", "h100_pcie",
    "h100_sxm", "h200_sxm", "l4", "l40s", "rtx_pro_6000_server",
)  # fmt: skip
"""The systems aiconfigurator-core 0.12.0 ships (what an error names when the package is missing)."""

HOST_LINKS = {32: "pcie4-host", 64: "pcie5-host", 128: "pcie6-host"}
"""The host path (a name from emulation.profiles.LINKS) by the file's PCIe bandwidth, GB/s a direction."""


def package_dir() -> Path | None:
    """The installed package's folder (its `__init__` is not run), or None when it is not installed."""
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def missing_package_line() -> str:
    """What to do when the package is not installed, in one sentence."""
    return (
        f"{PACKAGE} is not installed (pip install {PACKAGE}=={PACKAGE_VERSION}; it ships for Linux "
        "x86-64 and aarch64 and macOS arm64)"
    )


@functools.cache
def system_gpus() -> dict[str, GpuProfile]:
    """Every system file of the installed package as a GPU, by its file name ({} without the package)."""
    root = package_dir()
    if root is None:
        return {}
    out = {}
    for path in sorted((root / "systems").glob("*.yaml")):
        raw = yaml.load(path.read_text(), Loader=_LOADER)
        if isinstance(raw, dict) and "gpu" in raw and "node" in raw:
            out[path.stem] = gpu_from_system(path.stem, raw)
    return out


def gpu_from_system(name: str, raw: dict[str, Any]) -> GpuProfile:
    """One system file's figures as a `GpuProfile` (the table in the module docstring)."""
    gpu, node = raw["gpu"], raw["node"]
    rack = node.get("num_gpus_per_rack")  # an NVL72 rack: NVLink joins all of its GPUs
    pcie_gbs = node["pcie_bw"] / 1e9
    host_link = HOST_LINKS[min(HOST_LINKS, key=lambda gbs: abs(gbs - pcie_gbs))]
    return GpuProfile(
        name,
        peak_tflops=gpu["bfloat16_tc_flops"] / 1e12,
        memory_bw_gbs=gpu["mem_bw"] / 1e9,
        memory_gb=gpu["mem_capacity"] / 1e9,
        tp_link_gbs=node["intra_node_bw"] / 1e9,
        peak_fp8_tflops=_tflops(gpu, "fp8_tc_flops"),
        peak_fp4_tflops=_tflops(gpu, "fp4_tc_flops"),
        sm_version=gpu.get("sm_version"),
        gpus_per_node=rack or node["num_gpus_per_node"],
        scale_out_gbs=(node["inter_rack_bw"] if rack else node["inter_node_bw"]) / 1e9,
        host_link=host_link,
        source=f"{PACKAGE} {PACKAGE_VERSION} systems/{name}.yaml",
    )


def _tflops(gpu: dict[str, Any], key: str) -> float | None:
    return gpu[key] / 1e12 if key in gpu else None
