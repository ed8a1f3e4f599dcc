"""Joining Ray for live runs: a cluster at an address, or a local Ray started here offering each pool's
resource; and checking that the cluster can place every engine before anything is created (an engine
that cannot place would wait for ever).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence

import ray

from cluster.config_load import ConfigError
from emulation.config import TestbedConfig

_LOCAL_NODE_IP = "127.0.0.2"
"""A local Ray binds a loopback address of its own (Ray rewrites 127.0.0.1 to the host's address)."""


def connect(configs: Sequence[TestbedConfig], address: str | None) -> bool:
    """Join Ray (`address`, or the one this process already joined) or start a local one offering
    enough of each pool's resource for every config; True if started here."""
    if ray.is_initialized():
        return False
    if address:
        _check_reachable(address)
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except ConnectionError as e:
            raise ConfigError(f"--address={address}: {e}") from None
        return False
    ray.init(
        _node_ip_address=_LOCAL_NODE_IP,
        num_cpus=os.cpu_count(),
        resources=_resources_needed(configs),
        object_store_memory=512 * 1024**2,
        include_dashboard=False,
        logging_level=logging.WARNING,
    )
    return True


def _check_reachable(address: str) -> None:
    """Fail at once on a head nobody answers at (Ray itself retries for minutes)."""
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    allowed = "allowed: auto (the cluster started on this machine) or HOST:PORT of a running Ray head"
    if not host or not port.isdigit():
        raise ConfigError(f"--address={address}: not HOST:PORT; {allowed}")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise ConfigError(
            f"--address={address}: no Ray head answers there ({e.strerror or e}); {allowed}"
        ) from None


def _resources_needed(configs: Sequence[TestbedConfig]) -> dict[str, float]:
    """Units of each pool's resource a local Ray offers: one per emulated GPU (replicas x ep x tp)."""
    needed: dict[str, float] = {}
    for cfg in configs:
        for role, pool in cfg.pools.by_role():
            needed[role] = max(needed.get(role, 0), pool.replicas * pool.num_gpus)
    return needed


def disconnect() -> None:
    """Stop the Ray this process started (all its processes) or leave the one it joined."""
    ray.shutdown()


def check_resources(cfg: TestbedConfig) -> None:
    """Each pool's engines fit the nodes' units of its resource, `tp` of them on one node per engine
    (per EP rank: a replica's ranks may span nodes; an engine that cannot place would wait forever)."""
    per_node = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    for role, pool in cfg.pools.by_role():
        units = [r.get(role, 0.0) for r in per_node]
        ranks = f" x ep={pool.ep} ranks" if pool.ep > 1 else ""
        if pool.replicas and sum(int(u // pool.tp) for u in units) < pool.replicas * pool.ep:
            raise ConfigError(
                f"pools.{role}: {pool.replicas} replica(s){ranks} x tp={pool.tp} need {pool.tp} '{role}' "
                f"resource units on one node each; the Ray cluster's nodes offer {sum(units):g} in all "
                f"(at most {max(units, default=0.0):g} on one node); allowed: start nodes with "
                f"--resources='{{\"{role}\": N}}' (one unit per GPU)"
            )
