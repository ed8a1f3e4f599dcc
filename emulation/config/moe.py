"""Mixture-of-experts targets: how tokens pick experts, and the fabric expert parallelism crosses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from emulation.config.strict import STRICT


@dataclass(frozen=True)
class MoeRoutingConfig:
    """Which experts a step's tokens reach, as the time model expects it (no router runs for the
    target: the runner's tiny router routes the runner's tokens, not the target's)."""

    __pydantic_config__ = STRICT

    skew: Literal["uniform", "zipf", "file"] = "uniform"
    """uniform: every expert equally likely (a well-balanced router); zipf: expert popularity falls as
    rank^-zipf_s, the hot experts scattered over the EP ranks by `seed`; file: per-expert loads read
    from `loads_file` (e.g. counted from a real router's choices)."""
    zipf_s: Annotated[float, Field(ge=0, le=4)] = 1.0
    """zipf: the exponent (0 is uniform)."""
    loads_file: str | None = None
    """file: a JSON list or one-number-per-line text of non-negative loads, one per routed expert, in
    expert order (their ratio is what counts)."""
    seed: int = 0
    """zipf: which experts are the hot ones (a seeded permutation of their ranks)."""


@dataclass(frozen=True)
class EpFabricConfig:
    """The network expert-parallel all-to-alls cross. Inside a node the GPUs' scale-up link (NVLink
    class); between nodes each GPU's scale-out NIC (RDMA). Unset figures come from the GPU profile."""

    __pydantic_config__ = STRICT

    gpus_per_node: Annotated[int | None, Field(ge=1)] = None
    """GPUs sharing the scale-up link (an HGX node: 8; a CloudMatrix384 supernode: 384)."""
    scale_up_gbs: Annotated[float | None, Field(gt=0)] = None
    """Per GPU, per direction, GB/s, inside a node (None: the GPU's tp_link_gbs)."""
    scale_out_gbs: Annotated[float | None, Field(gt=0)] = None
    """Per GPU, per direction, GB/s, between nodes (None: the GPU's scale_out_gbs)."""
    scale_up_latency_s: Annotated[float, Field(ge=0)] = 10e-6
    """Fixed cost of one all-to-all inside a node (launch, synchronisation)."""
    scale_out_latency_s: Annotated[float, Field(ge=0)] = 25e-6
    """Fixed cost of one all-to-all that crosses nodes (RDMA round trips, synchronisation)."""
    all_to_all_bandwidth: Annotated[float, Field(gt=0, le=1)] = 0.8
    """Share of the link's bandwidth an all-to-all achieves (an assumption, as for all-reduces:
    measure it, e.g. with DeepEP's tests)."""
    dispatch_bytes: Annotated[float, Field(gt=0, le=4)] = 1.0
    """Bytes per hidden value a dispatch sends (1: FP8, as DeepSeek's and DeepEP's; 2: BF16)."""
    combine_bytes: Annotated[float, Field(gt=0, le=4)] = 2.0
    """Bytes per hidden value a combine returns (BF16)."""
    max_nodes: Annotated[int, Field(ge=1)] = 64
    """Most nodes one replica's EP group may span (the fabric's reach)."""
