"""Everything that crosses an actor boundary: small dataclasses of ids, token IDs and descriptors.

Tensors cross only where they are the point: KV in `KVPayload`, an image's patches in `MultiModalItem`
(for the vision encoder). Times are emulated seconds.
"""

from messages.kv import BlockRemoved, BlockStored, KVEvents, KVPayload, KVPull, KVStoreChanges, SsmState
from messages.kv_transfer_params import KVTransferParams
from messages.multimodal import EncodedImage, EncodeJob, MultiModalItem
from messages.requests import (
    OFFLOAD_TIERS,
    ClientRequest,
    EngineOutput,
    EngineRequest,
    FinishedReason,
    KVHandoffTimes,
    OffloadLoad,
    OffloadStore,
    RenderedPrompt,
    RenderSpec,
    RequestTimes,
    token_ids_valid,
)
from messages.result import PrefillLeg, RequestResult, ServerRecord
from messages.token_ids import PromptIds, TokenIds

__all__ = [
    "OFFLOAD_TIERS",
    "BlockRemoved",
    "BlockStored",
    "ClientRequest",
    "EncodeJob",
    "EncodedImage",
    "EngineOutput",
    "EngineRequest",
    "FinishedReason",
    "KVEvents",
    "KVHandoffTimes",
    "KVPayload",
    "KVPull",
    "KVStoreChanges",
    "KVTransferParams",
    "MultiModalItem",
    "OffloadLoad",
    "OffloadStore",
    "PrefillLeg",
    "PromptIds",
    "RenderSpec",
    "RenderedPrompt",
    "RequestResult",
    "RequestTimes",
    "ServerRecord",
    "SsmState",
    "TokenIds",
    "token_ids_valid",
]
