"""`kv_transfer_params`: vLLM's P/D handshake, typed. Updates are `dataclasses.replace`, never mutation.

    proxy -> prefill     do_remote_decode (and, pulling back, where decode holds the last turn)
    prefill -> proxy     where the prompt's KV is (remote_*), its prompt IDs, when it was sent
    proxy -> decode      the same, less the prompt IDs (the decode request carries them)
    decode -> proxy      bidirectional: where a finished turn's blocks are, for the next turn

Only the HTTP edge sees it as JSON (`from_json`, for a P/D proxy's request to a decode server).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from messages.token_ids import PromptIds


@dataclass(frozen=True)
class KVTransferParams:
    """What one side of a handoff tells the other (vLLM's field names where vLLM has them)."""

    do_remote_decode: bool = False
    """To prefill: a decode engine will pull this request's KV, so its blocks are held after it finishes
    (bidirectional, to decode: keep the turn's blocks for the conversation's next turn)."""
    do_remote_prefill: bool = False
    """To decode: the prompt's KV comes from another engine (a prefill pulling back: from decode)."""
    remote_engine_id: str | None = None
    """The engine holding the KV: whom the pull and the free go to (a peer, by id)."""
    remote_request_id: str | None = None
    """The request id the holder keys the KV by: what the pull and the free name."""
    remote_block_ids: tuple[int, ...] | None = None
    """The holder's blocks with the KV (NIXL's descriptor): how many blocks the transfer moves."""
    remote_block_hashes: tuple[bytes, ...] | None = None
    """Bidirectional: the chained hashes of those blocks, so that prefill takes only those whose hashes
    agree with its prompt's (kv_transfer.reuse=verified)."""
    prompt_token_ids: PromptIds | None = None
    """From prefill: its prompt's token IDs, for the proxy to give decode instead of rendering again."""
    kv_push: bool = False
    """To decode (kv_transfer.mode=push): the KV moves only once prefill's `kv_ready` brings where it is."""
    kv_sent_s: float | None = None
    """From prefill: emulated time it finished the prompt, when a push may start sending."""
    prefill_compute_s: float | None = None
    """From prefill: emulated seconds of its own compute on the prompt, under which a layer-wise push
    hides."""
    pull_back: bool = False
    """To prefill, bidirectional: pull back from decode's last turn the blocks the prompt shares."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> KVTransferParams:
        """The params a request's JSON gives; `InvalidKVTransferParams` names an unknown or mistyped
        field (null leaves an optional field unset)."""
        values: dict[str, Any] = {}
        for key, value in d.items():
            if key in VLLM_ADDRESS_FIELDS:
                continue
            if key not in _JSON_FIELDS:
                raise InvalidKVTransferParams(
                    key, f"unknown field ({_shown(value)}); allowed: {', '.join(_JSON_FIELDS)}"
                )
            convert, expected = _JSON_FIELDS[key]
            if value is None and _optional(key):
                continue
            converted = convert(value)
            if converted is None:
                raise InvalidKVTransferParams(key, f"{_shown(value)} is not allowed; expected {expected}")
            values[key] = converted
        return cls(**values)


VLLM_ADDRESS_FIELDS = frozenset({"remote_host", "remote_port", "tp_size"})
"""What vLLM's NIXL connector also sends (where to reach the holder, its TP size): taken and unused, so that
a vLLM P/D proxy's requests pass; the testbed reaches a holder by `remote_engine_id`."""


class InvalidKVTransferParams(ValueError):
    """A field of `kv_transfer_params` that is unknown or of the wrong type (an HTTP 400 at the edge)."""

    def __init__(self, field: str, why: str) -> None:
        self.param = f"kv_transfer_params.{field}"
        """The field, as the request names it."""
        super().__init__(f"{self.param}: {why}")


def _shown(value: object) -> str:
    """`value` as an error message quotes it (a long prompt's IDs cut short)."""
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _optional(name: str) -> bool:
    return next(f for f in dataclasses.fields(KVTransferParams) if f.name == name).default is None


def _bool(v: object) -> bool | None:
    return v if isinstance(v, bool) else None


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _seconds(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _ints(v: object) -> list[int] | None:
    return v if isinstance(v, list) and all(type(x) is int for x in v) else None


def _int_tuple(v: object) -> tuple[int, ...] | None:
    ints = _ints(v)
    return tuple(ints) if ints is not None else None


def _hashes(v: object) -> tuple[bytes, ...] | None:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        return None
    try:
        return tuple(bytes.fromhex(x) for x in v)
    except ValueError:
        return None


_JSON_FIELDS: dict[str, tuple[Callable[[object], Any], str]] = {
    "do_remote_decode": (_bool, "a boolean"),
    "do_remote_prefill": (_bool, "a boolean"),
    "remote_engine_id": (_str, "a string or null"),
    "remote_request_id": (_str, "a string or null"),
    "remote_block_ids": (_int_tuple, "a list of ints or null"),
    "remote_block_hashes": (_hashes, "a list of hex strings or null"),
    "prompt_token_ids": (_ints, "a list of ints or null"),
    "kv_push": (_bool, "a boolean"),
    "kv_sent_s": (_seconds, "a number or null"),
    "prefill_compute_s": (_seconds, "a number or null"),
    "pull_back": (_bool, "a boolean"),
}
"""Each field's JSON reading (None: the value has the wrong type) and what it allows."""
