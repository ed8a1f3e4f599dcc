"""Hardware and model profiles: the *sizes* of what the testbed emulates, as data.

Only sizes matter to the time model: a target model is its parameter and KV geometry, a GPU is its peak
compute, memory bandwidth and capacity, a link is its bandwidth and fixed costs. Figures are public specs
(DESIGN.md, "Reference facts"); the `guide-testbox` link is fitted to the guide's measured 1.3 s for a
470 MB KV.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from emulation.gpu_profile import GpuProfile
from emulation.hf_config import profile_from_source
from emulation.hybrid_models import HYBRID_MODELS
from emulation.model_profile import ModelProfile
from emulation.moe_models import MOE_MODELS
from emulation.quantization import quantized
from emulation.silicon_systems import system_gpus
from emulation.ssm import SsmGeometry

__all__ = ["GPUS", "LINKS", "MODELS", "GpuProfile", "LinkProfile", "ModelProfile"]


@dataclass(frozen=True)
class LinkProfile:
    """A KV-handoff path between two engines.

    Transfer time = bytes / bandwidth + latency + per-transfer overhead + per-block overhead x blocks.
    """

    name: str
    link_gbps: float
    """Usable bandwidth in gigabits per second."""
    latency_s: float
    """One-way latency."""
    per_transfer_overhead_s: float
    """Fixed cost of one transfer (registration, handshake, notification)."""
    per_block_overhead_s: float = 0.0
    """Cost per KV block moved (descriptor handling, host staging without peer-to-peer)."""

    @property
    def bytes_per_s(self) -> float:
        return self.link_gbps * 1e9 / 8


HAND_TYPED_GPUS: dict[str, GpuProfile] = {
    g.name: g
    for g in (
        # FP8 dense peaks from NVIDIA's datasheets (half the "with sparsity" figures): L40S 733, H100 and
        # H200 SXM 1,979 TFLOP/s; the A100 has no FP8 (one-byte weights are upcast to BF16 there).
        # L40S: PCIe 4.0; no DGX node, so 1 TB for 8 GPUs is assumed (a two-socket PCIe server).
        GpuProfile(
            "l40s",
            362.0,
            864.0,
            48.0,
            l2_cache_mb=96.0,
            peak_fp8_tflops=733.0,
            host_memory_gb=128.0,
            host_link="pcie4-host",
            sm_version=89,
        ),
        GpuProfile("h100-sxm", 989.0, 3350.0, 80.0, tp_link_gbs=450.0, peak_fp8_tflops=1979.0, sm_version=90),
        GpuProfile("h200", 989.0, 4800.0, 141.0, tp_link_gbs=450.0, peak_fp8_tflops=1979.0, sm_version=90),
        GpuProfile(
            "a100-80gb",
            312.0,
            2039.0,
            80.0,
            l2_cache_mb=40.0,
            tp_link_gbs=300.0,
            host_link="pcie4-host",
            sm_version=80,
        ),
        # H800 SXM: H100 SXM's compute and HBM (989 / 1,979 dense BF16 / FP8 TFLOP/s, 3,352 GB/s, 80 GB),
        # NVLink cut to 400 GB/s both ways, one 400 Gb/s CX7 InfiniBand NIC per GPU (DeepSeek, arXiv
        # 2505.09343 section 4.1; DeepSeek-V3 report section 3.2.2 measured ~160 and ~50 GB/s); host
        # memory and PCIe as an HGX H100's (assumed).
        GpuProfile("h800", 989.0, 3352.0, 80.0, tp_link_gbs=200.0, peak_fp8_tflops=1979.0, sm_version=90),
        # HGX/DGX B200: 2,250 / 4,500 dense BF16 / FP8 TFLOP/s, 8 TB/s, 180 GB as DGX B200 exposes it
        # (TensorRT-LLM's perf overview), NVLink 5 at 1.8 TB/s both ways; NIC: a 400 Gb/s CX7 per GPU;
        # dense FP4 9,000 TFLOP/s (HGX B200's 144 PFLOPS sparse over 8 GPUs, halved).
        GpuProfile(
            "b200",
            2250.0,
            8000.0,
            180.0,
            tp_link_gbs=900.0,
            peak_fp8_tflops=4500.0,
            peak_fp4_tflops=9000.0,
            sm_version=100,
        ),
        # Ascend 910C (two dies): ~752 dense BF16 TFLOP/s, 128 GB at 3.2 TB/s; no FP8, INT8 ~1,504 TOPS
        # (derived from CloudMatrix-Infer's tokens/s per TFLOPS, arXiv 2506.12708); a CloudMatrix384
        # supernode joins 384 NPUs by its UB network at 392 GB/s per NPU each way, RDMA 400 Gb/s per
        # NPU between supernodes. Secondary sources (Huawei publishes little): re-check on your system.
        # Host memory and its path: the defaults (assumed).
        GpuProfile(
            "ascend-910c",
            752.0,
            3200.0,
            128.0,
            tp_link_gbs=392.0,
            peak_fp8_tflops=1504.0,
            gpus_per_node=384,
        ),
    )
}

GPUS: dict[str, GpuProfile] = HAND_TYPED_GPUS | {
    name: gpu for name, gpu in system_gpus().items() if name not in HAND_TYPED_GPUS
}
"""Every GPU name: the hand-typed ones (each with its sources above; the presets and the fitted
efficiencies were made on them), then every system aiconfigurator-core describes, read from its files
(`emulation.silicon_systems`). `l40s` is both: the hand-typed one is kept (the package's differs in
memory only, 48.3 against 48.0 GB, and by 0.05 of 362 TFLOP/s: tests/test_silicon_systems.py)."""

MODELS: dict[str, ModelProfile] = {
    m.name: m
    for m in (
        ModelProfile(
            "qwen2.5-7b",
            num_layers=28,
            num_heads=28,
            num_kv_heads=4,
            head_dim=128,
            hidden_size=3584,
            intermediate_size=18944,
            vocab_size=152064,
        ),
        ModelProfile(  # Qwen2.5-VL-3B's language model (Qwen2.5-3B's geometry), with its ViT
            "qwen2.5-vl-3b",
            num_layers=36,
            num_heads=16,
            num_kv_heads=2,
            head_dim=128,
            hidden_size=2048,
            intermediate_size=11008,
            vocab_size=151936,
            tie_word_embeddings=True,
            vision_encoder="qwen2.5-vl-vit-3b",
        ),
        ModelProfile(  # Qwen3-VL-4B-Instruct's language model (config.json text_config), with its ViT
            "qwen3-vl-4b",
            num_layers=36,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            hidden_size=2560,
            intermediate_size=9728,
            vocab_size=151936,
            tie_word_embeddings=True,
            vision_encoder="qwen3-vl-vit-4b",
        ),
        ModelProfile(
            "llama-3.1-8b",
            num_layers=32,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            hidden_size=4096,
            intermediate_size=14336,
            vocab_size=128256,
        ),
        ModelProfile(
            "llama-3.1-70b",
            num_layers=80,
            num_heads=64,
            num_kv_heads=8,
            head_dim=128,
            hidden_size=8192,
            intermediate_size=28672,
            vocab_size=128256,
        ),
    )
}

# Qwen2.5-VL-7B's language model has Qwen2.5-7B's geometry; its ViT is in emulation.vision.
MODELS["qwen2.5-vl-7b"] = dataclasses.replace(
    MODELS["qwen2.5-7b"], name="qwen2.5-vl-7b", vision_encoder="qwen2.5-vl-vit-7b"
)
MODELS.update((m.name, m) for m in MOE_MODELS + HYBRID_MODELS)

# The guide's box moved 512 blocks (8,192 tokens, 470 MB) in ~1.3 s without peer-to-peer: the cost is
# per-block staging through the host, not bandwidth, so the fit puts it in per_block_overhead_s.
_TESTBOX_BLOCKS = 8192 // 16
_TESTBOX_WIRE_S = 512 * 16 * 57344 / (200e9 / 8)

LINKS: dict[str, LinkProfile] = {
    link.name: link
    for link in (
        LinkProfile("pcie4-x16", link_gbps=200.0, latency_s=5e-6, per_transfer_overhead_s=1e-3),
        # 400 Gb/s RDMA with NIXL-class fixed costs: an 8k-token Qwen2.5-7B KV moves in ~20 ms.
        LinkProfile("rdma-400g", link_gbps=400.0, latency_s=5e-6, per_transfer_overhead_s=10e-3),
        LinkProfile("nvlink", link_gbps=3200.0, latency_s=2e-6, per_transfer_overhead_s=0.5e-3),
        # A GPU's copies to and from pinned host memory (KV offloading): PCIe 4.0 and 5.0 x16 carry 32
        # and 64 GB/s a direction raw; about 25 and 50 GB/s is what copies reach (an assumption to
        # re-measure with nvbandwidth on your system), one copy launch per transfer.
        LinkProfile("pcie4-host", link_gbps=200.0, latency_s=5e-6, per_transfer_overhead_s=20e-6),
        LinkProfile("pcie5-host", link_gbps=400.0, latency_s=5e-6, per_transfer_overhead_s=20e-6),
        # PCIe 6.0 x16 (128 GB/s a direction raw: B200 and B300 in aiconfigurator-core's system files),
        # copies assumed at the same share of raw as the two above.
        LinkProfile("pcie6-host", link_gbps=800.0, latency_s=5e-6, per_transfer_overhead_s=20e-6),
        # A local NVMe SSD (PCIe 4.0 x4): ~7 GB/s sequential reads on datasheets, ~0.1 ms an access.
        LinkProfile("nvme-gen4", link_gbps=56.0, latency_s=100e-6, per_transfer_overhead_s=50e-6),
        LinkProfile(
            "guide-testbox",
            link_gbps=200.0,
            latency_s=5e-6,
            per_transfer_overhead_s=0.0,
            per_block_overhead_s=(1.3 - _TESTBOX_WIRE_S - 5e-6) / _TESTBOX_BLOCKS,
        ),
    )
}


SSM_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
"""Bytes of a recurrent-state element by `target.mamba_ssm_cache_dtype`."""


def base_profile(model: str) -> ModelProfile:
    """`model` as named: a built-in profile, or one read from its config (a path or a shipped
    Hugging Face id: emulation.hf_config)."""
    return MODELS[model] if model in MODELS else profile_from_source(model)


def target_model(
    model: str,
    mamba_ssm_cache_dtype: str = "auto",
    weights: str = "auto",
    experts: str = "auto",
    kv_cache: str = "auto",
) -> ModelProfile:
    """The emulated target `model` (`base_profile`) with its SSM state in `mamba_ssm_cache_dtype`
    (auto: the profile's own) and its `weights`, `experts` and `kv_cache` formats
    (`quantization.quantized`); every reader of the target takes it from here."""
    profile = quantized(base_profile(model), weights, experts, kv_cache)
    if mamba_ssm_cache_dtype == "auto" or profile.ssm is None:
        return profile
    ssm = dataclasses.replace(profile.ssm, ssm_dtype_bytes=SSM_DTYPE_BYTES[mamba_ssm_cache_dtype])
    return _with_ssm(profile, ssm)


@functools.cache
def _with_ssm(profile: ModelProfile, ssm: SsmGeometry) -> ModelProfile:
    """One profile object per variant (its cached derived figures are computed once)."""
    return dataclasses.replace(profile, ssm=ssm)
