"""Moving KV and image embeddings between engines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from emulation.config.named import named
from emulation.config.strict import STRICT
from emulation.profiles import LINKS


@dataclass(frozen=True)
class ECTransferConfig:
    """Moving image embeddings from the encoder pool to prefill (vLLM's EC connector)."""

    __pydantic_config__ = STRICT

    link: Annotated[str, named("link", LINKS)] = "rdma-400g"
    """Link between encoder and prefill engines, a name from emulation.profiles.LINKS."""


@dataclass(frozen=True)
class KVTransferConfig:
    __pydantic_config__ = STRICT

    link: Annotated[str, named("link", LINKS)] = "pcie4-x16"
    """Link between prefill and decode engines, a name from emulation.profiles.LINKS."""
    mode: Literal["pull", "push"] = "pull"
    """pull: decode reads the KV once it has the request and notices completion at its next step
    boundary (vLLM's NIXL connector); push: decode gets the request first and reserves blocks, prefill
    sends into them once it has finished and they exist (decode-first), and decode is notified."""
    layerwise: bool = False
    """push only: stream each layer's KV while the next computes, hiding the transfer under the
    request's own prefill compute that ran after decode's blocks existed."""
    link_scope: Literal["prefill", "fabric"] = "prefill"
    """Which transfers share a link's wire. prefill: each prefill engine's own egress (every pull from
    it queues there, whichever decode engine started it); fabric: one link for the whole deployment (a
    shared switch or PCIe root), every transfer queues on it."""
    hold_timeout_s: Annotated[float, Field(gt=0)] = 120.0
    """Prefill side: release a finished request's KV if no decode engine pulled it within this time."""
    bidirectional: bool = False
    """pull only: decode keeps a finished turn's blocks (prompt and answer) for the conversation's next
    turn, and prefill pulls back the blocks of them it lacks instead of computing them again (vLLM's
    NixlConnector bidirectional mode; conversations are the replayed sessions)."""
    decoder_kv_blocks_ttl_s: Annotated[float, Field(gt=0)] = 480.0
    """bidirectional: how long decode keeps a conversation's blocks waiting for its next turn."""
    load_failure_policy: Literal["recompute", "fail"] = "fail"
    """A decode engine's failed KV load (vLLM's `kv_load_failure_policy`). fail: the request ends with
    an error (vLLM's default); recompute: it computes its prompt here instead (a pull back always
    does)."""
    reuse: Literal["verified", "positional"] = "verified"
    """bidirectional: which of decode's blocks prefill takes. verified: the leading blocks whose chained
    hashes match its own prompt's (the prefix cache's rule; stops at the first difference);
    positional: decode's blocks by position, as if the new prompt began with decode's sequence (what
    vLLM issue #43094 describes: wrong KV when the template or harness edited the history)."""
