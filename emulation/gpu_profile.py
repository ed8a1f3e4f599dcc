"""A GPU as the time models see it: peak compute per format, memory, its links."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Compute = Literal["bf16", "fp8", "fp4"]
"""The format a GEMM's tensor cores compute in."""


@dataclass(frozen=True)
class GpuProfile:
    name: str
    peak_tflops: float
    """Dense BF16 tensor-core peak, TFLOP/s."""
    memory_bw_gbs: float
    """HBM/GDDR bandwidth, GB/s (1e9 bytes)."""
    memory_gb: float
    """Device memory, GB (1e9 bytes)."""
    l2_cache_mb: float = 50.0
    """On-chip L2 cache, MB: an activation that fits stays there between kernels (no HBM traffic)."""
    tp_link_gbs: float = 32.0
    """Per-GPU, per-direction bandwidth of the link tensor-parallel all-reduces cross, GB/s: NVLink on
    SXM parts (H100/H200: 900 GB/s both ways; A100: 600), PCIe 4.0 x16 otherwise (64 GB/s both ways)."""
    all_reduce_latency_s: float = 9e-6
    """Fixed cost of one all-reduce call (launch, synchronisation). Measured for vLLM's custom
    all-reduce on H100 SXM, messages of 512 B-32 KiB, outside CUDA graphs: 8.5-9.5 us at TP 2 and 4,
    9.3-11.8 us at TP 8 (sgl-project/sglang#2904); no A100 or L40S figure found, so the same value is
    used there. Set it from nccl-tests or that benchmark on your system."""
    peak_fp8_tflops: float | None = None
    """Dense 8-bit tensor-core peak, TFLOP/s (FP8; INT8 where the chip has no FP8): FP8 formats' GEMMs
    run at it (emulation.quantization). None: no such cores (FP8 weights run weight-only, as BF16)."""
    gpus_per_node: int = 8
    """GPUs one scale-up link joins (an HGX node)."""
    scale_out_gbs: float = 50.0
    """Per-GPU, per-direction bandwidth between nodes, GB/s (one 400 Gb/s RDMA NIC per GPU)."""
    host_memory_gb: float = 256.0
    """Host DRAM of its node per GPU, GB: what a KV offload tier of its engine may take at most. DGX
    H100, H200, A100 and B200 nodes have 2 TB for 8 GPUs (NVIDIA's datasheets); other parts are
    assumed (their entries say so)."""
    host_link: str = "pcie5-host"
    """The GPU's path to host memory, a name from emulation.profiles.LINKS: the PCIe generation it
    attaches with."""
    peak_fp4_tflops: float | None = None
    """Dense 4-bit floating-point tensor-core peak, TFLOP/s (NVFP4, MXFP4: Blackwell). None: no FP4
    tensor cores (4-bit weights run weight-only, as BF16 GEMMs)."""
    sm_version: int | None = None
    """CUDA compute capability x 10 (80 Ampere, 89 Ada, 90 Hopper, 100 and 103 Blackwell, 120
    Blackwell workstation); None: not an NVIDIA GPU. Decides which kernels vLLM runs a format with."""
    source: str = "hand-typed (emulation.profiles)"
    """Where the figures come from."""

    def tensor_core_peak(self, compute: Compute) -> float | None:
        """Dense tensor-core peak, TFLOP/s, computing in `compute`; None where the GPU has no such cores."""
        return {"bf16": self.peak_tflops, "fp8": self.peak_fp8_tflops, "fp4": self.peak_fp4_tflops}[compute]

    def peak_tflops_of(self, compute: Compute) -> float:
        """`tensor_core_peak` of a format this GPU has cores for (`emulation.quantization` runs the
        others as BF16)."""
        peak = self.tensor_core_peak(compute)
        assert peak is not None, (self.name, compute)
        return peak
