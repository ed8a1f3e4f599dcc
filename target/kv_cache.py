"""KV cache sizing of one engine replica: how many blocks its GPUs hold, how many a request needs.

tokens     [t0 ... t15 | t16 ... t31 | t32 t33]      34 tokens, block_size 16
blocks     [  block 0  |   block 1   | block 2 ]     cdiv(34, 16) = 3 (the last one partly full)
"""

from __future__ import annotations

from target.config import PoolConfig, TestbedConfig
from target.roofline import roofline_for


def cdiv(a: int, b: int) -> int:
    """Ceiling division (vLLM's `cdiv`): blocks needed for `a` tokens at `b` tokens per block."""
    return -(a // -b)


def num_gpu_blocks(cfg: TestbedConfig, pool: PoolConfig) -> int:
    """KV blocks of one replica of `pool`: the target GPUs' memory minus weights, unless overridden."""
    s = cfg.scheduler
    if s.num_gpu_blocks_override is not None:
        return s.num_gpu_blocks_override
    return roofline_for(cfg, pool).kv_capacity_tokens(cfg.target.gpu_memory_utilization) // s.block_size
