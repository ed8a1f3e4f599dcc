"""KV offloading: tiers below each engine's GPU KV, as vLLM's offloading connector, LMCache and
Mooncake's store add them.

    GPU KV (paged, prefix cache) ──store on completion──▶ host tier (per engine, over its PCIe)
         ▲                                          ├──▶ disk tier (per engine, local NVMe)
         └───────── load on a prefix hit ◀──────────└──▶ shared store (every engine's, over a link)

Every tier keys a block by the same chained block hash as the GPU prefix cache and evicts its least
recently used blocks. A tier of 0 GB is off; with every tier off the engine has GPU KV only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from emulation.config.named import named
from emulation.config.strict import STRICT
from emulation.profiles import LINKS


@dataclass(frozen=True)
class KVOffloadConfig:
    __pydantic_config__ = STRICT

    host_gb: Annotated[float, Field(ge=0)] = 0.0
    """Host-memory tier of each engine replica, GB (1e9 bytes) of target-model KV over all its GPUs
    (vLLM's `--kv-offloading-size`, in GB here as every size of the profiles). At most the host memory
    its GPUs' profile gives them (`GpuProfile.host_memory_gb` each). 0: no host tier."""
    host_link: Annotated[str | None, named("link", LINKS)] = None
    """GPU to host path of each of an engine's GPUs, a name from emulation.profiles.LINKS; None: the
    PCIe generation of the pool's GPU (`GpuProfile.host_link`)."""
    disk_gb: Annotated[float, Field(ge=0)] = 0.0
    """Local disk tier of each engine replica, GB (LMCache's local disk backend). 0: none."""
    disk_link: Annotated[str, named("link", LINKS)] = "nvme-gen4"
    """The disk's read and write path, a name from emulation.profiles.LINKS."""
    prompt_only: bool = True
    """Store a request's prompt blocks only, not those of its output (vLLM's `offload_prompt_only`, on
    by default): a conversation's answer reaches a tier when the next turn's prompt, which repeats it,
    is computed."""

    shared_gb: Annotated[float, Field(ge=0)] = 0.0
    """One KV store every engine stores into and loads from (Mooncake's store, LMCache's remote
    backend), GB of target-model KV, in the host memory of the deployment's nodes beside their host
    tiers. 0: none."""
    shared_link: Annotated[str | None, named("link", LINKS)] = None
    """Each engine's path to the shared store, a name from emulation.profiles.LINKS (an RDMA NIC for
    Mooncake's store); required with `shared_gb` > 0."""

    @property
    def enabled(self) -> bool:
        return self.host_gb > 0 or self.disk_gb > 0 or self.shared_gb > 0

    def for_role(self, role: str) -> bool:
        """Whether engines of `role` have the tiers: with any configured, all but decode engines (in
        P/D their prompts come from prefill: they look nothing up)."""
        return self.enabled and role != "decode"
