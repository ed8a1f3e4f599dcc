"""Where an engine actor goes in live mode: its pool's resource units, one per emulated GPU.

A replica of `tp` GPUs takes `tp` units of its role's resource on one node (`prefill: 4` offers four).
An expert-parallel replica is `ep` ranks of `tp` GPUs: a Ray placement group of `ep` bundles of `tp`
units each, packed onto as few nodes as hold them (one rank never splits across nodes, the ranks may:
wide EP spans nodes), the engine actor in rank 0's bundle. The group reserves every rank's units for
as long as the engine lives, as the real ranks would hold their GPUs; `release` frees it. An AFD
replica's FFN ranks go where the cluster offers `ffn` units (`ffn_options`), so experts and attention
can sit on different nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from cluster.config_load import ConfigError
from emulation.config import AfdConfig, PoolConfig

READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class EnginePlacement:
    options: dict[str, Any]
    """The engine actor's Ray options."""
    group: Any = None
    """The placement group of an EP replica's ranks (None: one bundle of tp units, no group)."""


def engine_placement(role: str, pool: PoolConfig, num_gpus: float) -> EnginePlacement:
    """The placement of one engine of `pool` in `role` (`num_gpus`: the runner's share of a real GPU)."""
    options: dict[str, Any] = {"num_cpus": 0, "num_gpus": num_gpus, "resources": {role: pool.tp}}
    if pool.ep == 1:
        return EnginePlacement(options)
    rank_0 = {role: float(pool.tp), **({"GPU": num_gpus} if num_gpus else {})}
    group = placement_group([rank_0] + [{role: float(pool.tp)}] * (pool.ep - 1), strategy="PACK")
    try:
        ray.get(group.ready(), timeout=READY_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise ConfigError(
            f"pools.{role}: {pool.ep} EP ranks of tp={pool.tp} '{role}' units each could not be placed "
            f"in {READY_TIMEOUT_S:g} s (units held by other engines or jobs); allowed: free units, or "
            "fewer ranks"
        ) from None
    strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=0)
    return EnginePlacement({**options, "scheduling_strategy": strategy}, group)


FFN_RESOURCE = "ffn"
"""The custom resource of nodes that hold AFD's FFN ranks (`ray start --resources='{"ffn": N}'`)."""


def ffn_options(afd: AfdConfig, num_ranks: int, num_gpus: float) -> dict[str, Any]:
    """The Ray options of an FFN rank's actor, one of `num_ranks` the run places (`num_gpus`: the
    runner's share of a real GPU): ffn_ep x ffn_tp units of `ffn` on one node where the cluster offers
    that resource, else anywhere (a cluster without it runs the FFN ranks beside the engines)."""
    options: dict[str, Any] = {"num_cpus": 0, "num_gpus": num_gpus}
    per_node = [n.get("Resources", {}).get(FFN_RESOURCE, 0.0) for n in ray.nodes() if n.get("Alive")]
    if not any(per_node):
        return options
    units = afd.ffn_gpus_per_rank
    if sum(int(u // units) for u in per_node) < num_ranks:
        raise ConfigError(
            f"afd: {num_ranks} FFN rank(s) x ffn_ep*ffn_tp={units} need {units} '{FFN_RESOURCE}' resource "
            f"units on one node each; the Ray cluster's nodes offer {sum(per_node):g} in all (at most "
            f"{max(per_node):g} on one node); allowed: more '{FFN_RESOURCE}' units, or none (the FFN ranks "
            "then go anywhere)"
        )
    return {**options, "resources": {FFN_RESOURCE: float(units)}}


def rank_nodes(placement: EnginePlacement) -> list[str]:
    """The node id of each EP rank's bundle (empty without a group)."""
    if placement.group is None:
        return []
    table = placement_group_table(placement.group)["bundles_to_node_id"]
    return [table[i] for i in sorted(table)]


def release(placements: list[EnginePlacement]) -> None:
    """Free the placement groups of dead or finished engines' ranks."""
    for p in placements:
        if p.group is not None:
            remove_placement_group(p.group)
