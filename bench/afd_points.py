"""Decode points under an SLA, for bench/afd_validation.py and bench/afd_sweep.py: the largest batch a
replica's ranks hold (KV permitting) whose steady decode step meets a TPOT or TBT, for a collocated (EP,
TP or DP) replica through the per-operator model and for an AFD replica through AfdLayout, each as
`time_model.time_model_for` builds them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from emulation.afd_layout import AfdLayout
from emulation.config import AfdConfig, EpFabricConfig, PoolConfig
from emulation.expert_parallel import ExpertParallel, ffn_weight_bytes_per_gpu
from emulation.kv_cache import kv_capacity_tokens
from emulation.operators import OperatorRoofline
from emulation.profiles import GPUS, LINKS, GpuProfile, LinkProfile, ModelProfile
from emulation.step_shape import StepItem, StepShape

MEMORY_UTILIZATION = 0.9
"""vLLM's default gpu_memory_utilization (the testbed's default too)."""
NIC_200G = dataclasses.replace(LINKS["rdma-400g"], name="rdma-200g", link_gbps=200.0)
"""MegaScale-Infer's NICs: 8 x 200 Gb/s a node of 8 GPUs, one a GPU (rdma-400g's latency)."""
PCIE_FABRIC = EpFabricConfig(scale_up_gbs=GPUS["l40s"].tp_link_gbs)
"""All-to-alls among the GPUs of one PCIe host: PCIe 4.0 x16, the testbed's PCIe GPU's TP link."""


def decodes(num: int, context: int) -> StepShape:
    """A step of `num` decodes, each over `context` tokens of KV."""
    return StepShape.of([StepItem(1, context, True)] * num)


def largest_batch(step_s: Callable[[int], float], cap: int, slo_s: float) -> tuple[int, float]:
    """The most requests (at most `cap`, what the KV cache holds) whose step takes at most `slo_s`, and
    that step's time; (0, 0.0) if not even one meets it. The step grows with the batch: bisection."""
    if cap < 1 or step_s(1) > slo_s:
        return 0, 0.0
    low, high = 1, cap
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if step_s(mid) <= slo_s else (low, mid - 1)
    return low, step_s(low)


def requests_fitting(model: ModelProfile, gpu: GpuProfile, pool: PoolConfig, context: int) -> int:
    """Requests of `context` + 1 tokens one (attention) rank of `pool` holds in its KV cache."""
    tokens = kv_capacity_tokens(model, gpu, pool, MEMORY_UTILIZATION) // pool.num_attention_ranks
    return tokens // (context + 1)


def collocated(
    model: ModelProfile, gpu: GpuProfile, pool: PoolConfig, fabric: EpFabricConfig | None = None
) -> OperatorRoofline:
    """The per-operator model of one replica of `pool`, as `time_model_for` builds it."""
    return OperatorRoofline(
        model, gpu, pool.attention_tp, experts=ExpertParallel(model, gpu, pool, fabric=fabric)
    )


@dataclass(frozen=True)
class BaselinePoint:
    """A collocated (EP, TP or DP) replica at its largest batch under the SLA."""

    model: OperatorRoofline
    num_ranks: int
    """Data-parallel attention ranks (1: one TP replica)."""
    num_gpus: int
    context: int
    batch: int
    """Requests a rank holds."""
    kv_cap: int
    step_s: float

    @property
    def tokens_per_gpu_s(self) -> float:
        return self.batch * self.num_ranks / self.step_s / self.num_gpus

    def tokens_per_gpu_s_at(self, batch: int) -> float:
        """Tokens a GPU computes a second at `batch` requests a rank, whatever its step time."""
        step_s = float(self.model.step_time_of(decodes(batch * self.num_ranks, self.context)).total_s)
        return batch * self.num_ranks / step_s / self.num_gpus

    def json(self) -> dict[str, object]:
        return {
            "ranks": self.num_ranks, "gpus": self.num_gpus, "context": self.context, "batch": self.batch,
            "kv_cap": self.kv_cap, "step_ms": self.step_s * 1e3, "tokens_per_gpu_s": self.tokens_per_gpu_s,
        }  # fmt: skip


def baseline_point(model: OperatorRoofline, pool: PoolConfig, gpu: GpuProfile, context: int,
                   slo_s: float) -> BaselinePoint:  # fmt: skip
    """`model`, a replica of `pool`, at the largest batch a rank holds within `slo_s`."""
    ranks = pool.num_attention_ranks
    cap = requests_fitting(model.model, gpu, pool, context)
    batch, step_s = largest_batch(
        lambda n: float(model.step_time_of(decodes(n * ranks, context)).total_s), cap, slo_s
    )
    return BaselinePoint(model, ranks, pool.num_gpus, context, batch, cap, step_s)


@dataclass(frozen=True)
class AfdPoint:
    """One AFD replica (A attention ranks, one FFN rank) at its largest batch under the SLA."""

    afd: AfdConfig
    attention_tp: int
    batch: int
    """Requests an attention rank holds."""
    step_s: float

    @property
    def num_gpus(self) -> int:
        a = self.afd
        return a.num_attention_ranks * self.attention_tp + a.num_ffn_ranks * a.ffn_gpus_per_rank

    @property
    def tokens_per_gpu_s(self) -> float:
        return self.batch * self.afd.num_attention_ranks / self.step_s / self.num_gpus

    def describe(self) -> str:
        a = self.afd
        ffn = f"EP{a.ffn_ep}" + (f"xTP{a.ffn_tp}" if a.ffn_tp > 1 else "")
        tp = f"xTP{self.attention_tp}" if self.attention_tp > 1 else ""
        return (f"A={a.num_attention_ranks}{tp}, FFN {ffn}, m={a.num_micro_batches}, dispatch {a.dispatch}, "
                f"{self.batch} a rank")  # fmt: skip

    def json(self) -> dict[str, object]:
        a = self.afd
        return {
            "attention_ranks": a.num_attention_ranks, "attention_tp": self.attention_tp,
            "ffn_ranks": a.num_ffn_ranks, "ffn_ep": a.ffn_ep, "ffn_tp": a.ffn_tp,
            "micro_batches": a.num_micro_batches, "dispatch": a.dispatch, "gpus": self.num_gpus,
            "batch": self.batch,
            "step_ms": self.step_s * 1e3, "tokens_per_gpu_s": self.tokens_per_gpu_s,
        }  # fmt: skip


def afd_point(model: ModelProfile, gpu: GpuProfile, afd: AfdConfig, link: LinkProfile, attention_tp: int,
              context: int, slo_s: float) -> AfdPoint | None:  # fmt: skip
    """`afd`'s replica at the largest batch an attention rank holds within `slo_s` (None: the experts do
    not fit the FFN GPUs, or no batch meets the SLA)."""
    if ffn_weight_bytes_per_gpu(model, afd) > gpu.memory_gb * 1e9 * MEMORY_UTILIZATION:
        return None
    layout = AfdLayout(model, gpu, gpu, afd, link, attention_tp)
    a = afd.num_attention_ranks
    cap = requests_fitting(
        model, gpu, PoolConfig(replicas=1, gpu=gpu.name, tp=attention_tp, afd=afd), context
    )
    batch, step_s = largest_batch(
        lambda n: float(layout.step_time_of(decodes(n * a, context)).total_s), cap, slo_s
    )
    return AfdPoint(afd, attention_tp, batch, step_s) if batch else None


def best_afd(points: Iterable[AfdPoint | None]) -> AfdPoint:
    return max((p for p in points if p is not None), key=lambda p: p.tokens_per_gpu_s)
