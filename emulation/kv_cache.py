"""KV cache sizing of one engine replica: how many blocks its GPUs hold, how many a request needs (a
hybrid model's: `hybrid_num_blocks`).

tokens     [t0 ... t15 | t16 ... t31 | t32 t33]      34 tokens, block_size 16
blocks     [  block 0  |   block 1   | block 2 ]     cdiv(34, 16) = 3 (the last one partly full)
"""

from __future__ import annotations

from emulation.config import PoolConfig, TestbedConfig
from emulation.expert_parallel import weight_bytes_per_gpu
from emulation.profiles import GPUS, GpuProfile, ModelProfile


def cdiv(a: int, b: int) -> int:
    """Ceiling division (vLLM's `cdiv`): blocks needed for `a` tokens at `b` tokens per block."""
    return -(a // -b)


def kv_capacity_tokens(
    model: ModelProfile, gpu: GpuProfile, pool: PoolConfig, gpu_memory_utilization: float
) -> int:
    """Tokens of KV a replica of `pool` holds, as vLLM sizes its cache (activations not reserved): on
    each GPU, its share of memory minus what it holds of the weights (`weight_bytes_per_gpu`), over its
    share of a token's KV; each data-parallel attention rank holds its own requests' KV."""
    per_rank = max(0, int(_usable_bytes(model, gpu, pool, gpu_memory_utilization)
                          // model.kv_bytes_per_token_per_gpu(pool.attention_tp)))  # fmt: skip
    return per_rank * pool.num_attention_ranks


def _usable_bytes(
    model: ModelProfile, gpu: GpuProfile, pool: PoolConfig, gpu_memory_utilization: float
) -> float:
    """One GPU's memory for KV: its share of memory minus what it holds of the weights."""
    return gpu.memory_gb * 1e9 * gpu_memory_utilization - weight_bytes_per_gpu(model, pool)


def hybrid_num_blocks(
    model: ModelProfile, gpu: GpuProfile, pool: PoolConfig, gpu_memory_utilization: float, block_size: int
) -> int:
    """Blocks of a model's one pool when its layers form KV cache groups (a hybrid's SSM layers, or
    sliding-window ones), as vLLM's hybrid KV cache manager sizes it: a block id holds a page in each
    layer of one group (`ModelProfile.kv_cache_groups`), so each GPU's memory goes in units of
    group_size pages::

        num_blocks = usable bytes // (group_size · page bytes)        (per data-parallel attention rank)

    A request takes blocks for its full-attention KV, as any model's, one a Mamba group for its state,
    and a sliding group's for its window."""
    page = model.page(pool.attention_tp, block_size).page_bytes
    usable = _usable_bytes(model, gpu, pool, gpu_memory_utilization)
    per_rank = max(0, int(usable // (model.kv_cache_groups.group_size * page)))
    return per_rank * pool.num_attention_ranks


def max_window_blocks(sliding_window: int, block_size: int, max_num_batched_tokens: int) -> int:
    """The most blocks a request holds in a sliding-window group (vLLM's admission cap,
    `SlidingWindowSpec.max_admission_blocks_per_request`, synchronous scheduling): the window before a
    step's first token, the step's tokens, and a block either side::

        cdiv(W - 1 + max_num_batched_tokens, block_size) + 1
    """
    return cdiv(sliding_window - 1 + max_num_batched_tokens, block_size) + 1


NUM_NULL_BLOCKS = 1
"""Of `num_gpu_blocks`, the blocks no request ever gets: vLLM's null block (block 0, a placeholder
for skipped blocks), counted in its `num_gpu_blocks` and in nothing else (usage is over the others)."""


def num_usable_blocks(cfg: TestbedConfig, pool: PoolConfig) -> int:
    """The KV blocks requests of one replica of `pool` can hold: `num_gpu_blocks` less the null block."""
    return num_gpu_blocks(cfg, pool) - NUM_NULL_BLOCKS


def num_gpu_blocks(cfg: TestbedConfig, pool: PoolConfig) -> int:
    """KV blocks of one replica of `pool` as vLLM counts them: the target GPUs' memory minus weights,
    unless overridden."""
    s = cfg.scheduler
    if s.num_gpu_blocks_override is not None:
        return s.num_gpu_blocks_override
    model, gpu, util = cfg.target.profile, GPUS[pool.gpu], cfg.target.gpu_memory_utilization
    if model.ssm is not None or model.num_sliding_layers:  # KV cache groups of a page each
        return hybrid_num_blocks(model, gpu, pool, util, s.block_size)
    return kv_capacity_tokens(model, gpu, pool, util) // s.block_size


def block_bytes(model: ModelProfile, pool: PoolConfig, block_size: int) -> int:
    """One KV block of a replica of `pool` over all its GPUs (each its share of the KV heads, heads
    replicated past num_kv_heads ranks): what a KV offload tier stores a block as."""
    tp = pool.attention_tp
    return round(model.kv_bytes_per_token_per_gpu(tp) * tp) * block_size
