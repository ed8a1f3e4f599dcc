"""vLLM 0.32's own defaults for the engine settings that decide TTFT under load, as it picks them for a
device (`vllm serve`): the step's token budget and running-request cap by GPU memory
(`EngineArgs.get_batch_defaults`), and the KV block size by the attention backend it selects.

    GPU memory (GiB, as NVML reports it)      max_num_batched_tokens   max_num_seqs
    >= 160                                    16,384                   1,024
    >= 70, and not an A100                    8,192                    1,024
    otherwise (A100, A30, L40S, L4, ...)      2,048                    256

then, for values left at these defaults only: tokens <= max_num_seqs x max_model_len, and
max_num_seqs <= tokens. The block size is 16 for every attention backend vLLM picks for a GQA model;
an MLA model's backend wants its own: 64 on Hopper with an FP8 KV cache (FlashMLA), 32 on Blackwell
(FlashInfer MLA), 16 otherwise (FlashAttention MLA, Triton MLA). Chunked prefill is on for every
decoder-only model (the testbed always chunks).
"""

from __future__ import annotations

from emulation.gpu_profile import GpuProfile
from emulation.model_profile import ModelProfile

GIB = 2**30


def batch_defaults(gpu: GpuProfile) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) `vllm serve` chooses on `gpu`."""
    memory_gib = gpu.memory_gb * 1e9 / GIB
    if memory_gib >= 160:
        return 16384, 1024
    if memory_gib >= 70 and "a100" not in gpu.name:
        return 8192, 1024
    return 2048, 256


def default_block_size(model: ModelProfile, gpu: GpuProfile) -> int:
    """Tokens per KV block of the attention backend vLLM selects for `model` on `gpu`."""
    if model.mla is None:
        return 16
    if gpu.sm_version in (100, 103):
        return 32
    if gpu.sm_version == 90 and model.kv_dtype_bytes == 1:
        return 64
    return 16
