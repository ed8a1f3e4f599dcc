"""Hybrid models' step time: the SSM layers' projections and scans as groups of their own, attention and
KV over the attention layers only, against hand arithmetic from the configs (emulation/ssm.py's counts);
the aggregate roofline reads the same figures."""

from __future__ import annotations

import pytest

from emulation.config import CpuOverhead, OperatorEfficiencies
from emulation.operators import OperatorRoofline
from emulation.profiles import GPUS, MODELS
from emulation.roofline import Roofline
from emulation.step_shape import StepItem

PEAK = OperatorEfficiencies(1.0, 1.0, 1.0, 1.0, 1.0)
NO_CPU = CpuOverhead(0.0, 0.0, 0.0)
NANO = MODELS["nemotron-3-nano-30b-a3b"]


def test_mamba2_flops_per_token_by_hand():
    """Nemotron-3-Nano's Mamba2 (64 heads of 64, 8 groups, state 128, chunk 128, conv 4 over 6,144
    channels): a prompt token 64·129·64 + 8·129·128 + 4·64·128·64 + 2·4·6,144 = 2,806,784 FLOPs a layer,
    a decode 5·64·64·128 + 49,152 = 2,670,592; projections 2,688 x (4,096 + 6,144 + 64) + 4,096 x 2,688."""
    g = NANO.ssm
    assert g is not None
    assert g.prefill_flops_per_token == 528_384 + 132_096 + 2_097_152 + 49_152
    assert g.decode_flops_per_token == 2_621_440 + 49_152
    assert NANO.ssm_params == 2688 * 10304 + 4096 * 2688
    qwen = MODELS["qwen3-next-80b-a3b"].ssm
    assert qwen is not None  # 32 value heads: 65·256 + 6·128·128 each, conv 2·4·8,192
    assert qwen.prefill_flops_per_token == 32 * (65 * 256 + 6 * 128 * 128) + 65_536


def test_nano_decode_pays_its_states_not_only_its_kv():
    """64 decodes at 1,023 tokens of context on two H100s (TP 2): each reads and writes its 23 states
    (1,067,008 B a rank) and reads 1,024 tokens of KV in 6 attention layers (512 B a token a layer a
    rank): 3.1 GB of state traffic against 201 MB of KV, so the scan group outweighs attention."""
    m = OperatorRoofline(NANO, GPUS["h100-sxm"], 2, PEAK, NO_CPU)
    step = m.step_time([StepItem(1, 1023, True)] * 64)
    scan = step.group("ssm_scan")
    assert scan.bytes == 23 * 2 * 1_067_008 * 64
    assert scan.flops == 23 / 2 * NANO.ssm.decode_flops_per_token * 64  # type: ignore[union-attr]
    decode = step.group("decode_attention")
    assert decode.bytes == 64 * 1024 * 6 * 512
    assert scan.memory_s > 10 * decode.memory_s and scan.memory_s > scan.compute_s
    qkv_o = step.group("qkv_o")
    attention = 2688 * (4096 + 512) + 4096 * 2688
    assert qkv_o.flops == 2 * 6 * attention * 64 / 2  # attention projections in 6 layers only
    assert step.group("ssm_proj").flops == 2 * 23 * NANO.ssm_params * 64 / 2
    assert step.all_reduce_s > 0 and NANO.num_all_reduces == 29 + 23  # one a block: 52


def test_a_prompt_chunk_passes_a_state_at_every_chunk_boundary():
    """A 4,096-token chunk on one GPU: its scan writes and reads back 4,096 / 128 = 32 chunk states
    (2 MiB of fp32 SSM state each) and its own state once, in each of the 23 Mamba layers."""
    m = OperatorRoofline(NANO, GPUS["h100-sxm"], 1, PEAK, NO_CPU)
    step = m.step_time([StepItem(4096, 0, True)])
    state = NANO.ssm.state(1)  # type: ignore[union-attr]
    assert step.group("ssm_scan").bytes == 23 * 2 * (state.nbytes + 32 * state.ssm_bytes)
    assert step.group("ssm_scan").flops == 23 * 4096 * NANO.ssm.prefill_flops_per_token  # type: ignore[union-attr]
    assert step.group("prefill_attention").flops == 4 * 32 * 128 * 6 * (4096 * 4097 // 2)


def test_the_aggregate_roofline_reads_the_same_ssm_work():
    """Granite's decodes under the aggregate model (no expert layout given: every expert's weights
    counted) add the scans' FLOPs and state bytes of ModelProfile.ssm_work to weights and KV (tp 1: the
    whole state)."""
    granite = MODELS["granite-4.0-h-tiny"]
    step = Roofline(granite, GPUS["h100-sxm"], 1).step_time([StepItem(1, 2047, True)] * 8)
    flops, nbytes = granite.ssm_work(0, 0, 8)
    assert nbytes == 36 * 2 * 806_400 * 8 and flops == 36 * 8 * granite.ssm.decode_flops_per_token  # type: ignore[union-attr]
    attention = granite.prefill_attention_flops_per_key * 8 * 2048
    assert step.flops == pytest.approx(
        2 * 8 * granite.num_layer_params + attention + 2 * 8 * granite.num_head_params + flops
    )
    assert step.bytes == pytest.approx(
        granite.step_weight_bytes + 8 * 2047 * granite.kv_bytes_per_token + nbytes
    )
