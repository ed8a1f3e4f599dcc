"""Hardware and model profiles: the *sizes* of what the testbed emulates, as data.

Only sizes matter to the time model: a target model is its parameter and KV geometry, a GPU is its peak
compute, memory bandwidth and capacity, a link is its bandwidth and fixed costs. Figures are public specs
(DESIGN.md, "Reference facts"); the `guide-testbox` link is fitted to the guide's measured 1.3 s for a
470 MB KV.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property


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


@dataclass(frozen=True)
class ModelProfile:
    """A target model's geometry, from its Hugging Face config values (the derived counts are cached:
    the time models read them at every step, and a frozen profile never changes them)."""

    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    dtype_bytes: int = 2
    """Bytes per weight and per KV element (bf16)."""
    vision_encoder: str | None = None
    """Its vision encoder, a name from emulation.vision.VISION_ENCODERS (None: text only)."""

    @cached_property
    def params_per_layer(self) -> int:
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (q + 2 * kv) + q * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size  # gate, up, down
        return attention + mlp

    @cached_property
    def num_layer_params(self) -> int:
        return self.num_layers * self.params_per_layer

    @cached_property
    def num_head_params(self) -> int:
        """LM-head parameters: read every step, multiplied only for tokens that need logits."""
        return self.vocab_size * self.hidden_size

    @cached_property
    def num_params(self) -> int:
        embeddings = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self.num_layer_params + self.num_head_params + embeddings

    @cached_property
    def weight_bytes(self) -> int:
        """Bytes resident on the GPU(s): every parameter, embeddings included."""
        return self.num_params * self.dtype_bytes

    @cached_property
    def step_weight_bytes(self) -> int:
        """Weight bytes a forward pass streams: layers + LM head (an embedding lookup reads a few rows)."""
        return (self.num_layer_params + self.num_head_params) * self.dtype_bytes

    @cached_property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_token_per_gpu(self, tp: int) -> float:
        """One token's KV on each of `tp` GPUs: its share of the KV heads, at least one head (past
        num_kv_heads ranks, heads are replicated, as vLLM does)."""
        return self.kv_bytes_per_token * math.ceil(self.num_kv_heads / tp) / self.num_kv_heads


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


GPUS: dict[str, GpuProfile] = {
    g.name: g
    for g in (
        GpuProfile("l40s", peak_tflops=362.0, memory_bw_gbs=864.0, memory_gb=48.0, l2_cache_mb=96.0),
        GpuProfile("h100-sxm", peak_tflops=989.0, memory_bw_gbs=3350.0, memory_gb=80.0, tp_link_gbs=450.0),
        GpuProfile("h200", peak_tflops=989.0, memory_bw_gbs=4800.0, memory_gb=141.0, tp_link_gbs=450.0),
        GpuProfile("a100-80gb", 312.0, 2039.0, 80.0, l2_cache_mb=40.0, tp_link_gbs=300.0),
    )
}

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
        LinkProfile(
            "guide-testbox",
            link_gbps=200.0,
            latency_s=5e-6,
            per_transfer_overhead_s=0.0,
            per_block_overhead_s=(1.3 - _TESTBOX_WIRE_S - 5e-6) / _TESTBOX_BLOCKS,
        ),
    )
}
