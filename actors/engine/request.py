"""The engine's view of one request: token IDs, how many are computed, and its KV blocks.

No prefill or decode phase: a request has `num_tokens` (prompt + output so far) and
`num_computed_tokens`, and each step schedules tokens so that computed catches up::

    prompt (8 tokens)          outputs
    [p0 p1 p2 p3 p4 p5 p6 p7 | o0 o1]      num_tokens = 10
    [=========== computed ==========]      num_computed_tokens = 9 -> next step computes o1 (1 token)
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import numpy as np

from messages import EngineRequest, FinishedReason, KVTransferParams, RequestTimes, token_ids_valid
from messages.token_ids import PromptIds, TokenIds, span


def check_request(
    request: EngineRequest, max_model_len: int, vocab_size: int | None, sees_images: bool = False
) -> None:
    """Raise ValueError, naming the request, unless an engine can run it (`sees_images`: its target
    has a vision encoder; `vocab_size`: the runner's, whose embedding lookup a bad token ID would
    break; None without a runner, where the API's edge has checked them)."""
    # The first sentence says what is wrong, the same for every request (failures are counted by it).
    rid = request.request_id
    if request.mm_items and not sees_images:
        raise ValueError(f"Images need a target model with a vision encoder. Request {rid!r}.")
    num_prompt = len(request.prompt_token_ids)
    n = num_prompt + request.max_tokens
    if n > max_model_len:
        raise ValueError(
            f"Prompt and max_tokens exceed max_model_len ({max_model_len}). Request {rid!r}: prompt "
            f"({num_prompt} tokens) + max_tokens ({request.max_tokens}) = {n}."
        )
    if vocab_size is not None and not token_ids_valid(request.prompt_token_ids, vocab_size):
        raise ValueError(f"Prompt token IDs must be ints in [0, {vocab_size}). Request {rid!r}.")


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class Request:
    __slots__ = (
        "block_hashes",
        "block_ids",
        "compute_s",
        "finished_reason",
        "forced_output_token_ids",
        "full_prompt_token_ids",
        "kv_transfer_params",
        "max_tokens",
        "mm_embeds",
        "mm_items",
        "num_computed_tokens",
        "num_offload_tokens",
        "num_published_blocks",
        "output_token_ids",
        "prompt_token_ids",
        "pull_back_tokens",
        "remote_kv_loaded",
        "request_id",
        "status",
        "stop_token_ids",
        "times",
    )

    def __init__(self, req: EngineRequest, now_s: float) -> None:
        self.request_id = req.request_id
        self.prompt_token_ids = req.prompt_token_ids
        self.full_prompt_token_ids: PromptIds | None = None
        """Prefill side of a hybrid model: the prompt as sent, when this engine computes it but its last
        token (`truncate_prompt`)."""
        self.max_tokens = req.max_tokens
        self.forced_output_token_ids = req.forced_output_token_ids
        self.stop_token_ids = frozenset(req.stop_token_ids)
        self.mm_items = req.mm_items
        self.mm_embeds: dict[str, np.ndarray | None] = {
            m.mm_hash: m.embeds for m in req.mm_items if m.encoded
        }
        """Embeddings of its images it has (sent with it by an encoder pool, encoded here, or from the
        encoder cache), by mm_hash; None with compute skip."""
        self.kv_transfer_params: KVTransferParams | None = req.kv_transfer_params
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.compute_s = 0.0
        """Emulated seconds of the steps that computed its tokens on this engine (its own compute)."""
        self.block_ids: list[int] = []
        self.block_hashes: list[bytes] = []
        """Chained hashes of the full blocks of tokens, extended as they are needed."""
        self.num_published_blocks = 0
        """Leading blocks of `block_ids` already in the prefix cache."""
        self.pull_back_tokens = 0
        """Pull back: the tokens of decode's leading blocks this request takes (set when admitted)."""
        self.num_offload_tokens = 0
        """Prompt tokens after its GPU prefix hit that its engine's offload tiers supply (set when
        admitted)."""
        self.remote_kv_loaded = False
        """Decode side: the prefill engine's KV is in this engine's blocks (never pulled twice: a 1-token
        prompt has no external tokens, and a preempted request recomputes locally, as in vLLM)."""
        self.status = RequestStatus.WAITING
        self.finished_reason: FinishedReason | None = None
        self.times = RequestTimes(queued_s=now_s)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_ids(self, start: int, end: int) -> list[int]:
        """Token IDs in [start, end) over prompt followed by outputs."""
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    def truncate_prompt(self, num_tokens: int) -> None:
        """Compute the prompt but its last `num_tokens` (vLLM's N-1 prefill for a hybrid model: decode
        computes them from the state as of before them); the prompt as sent is kept."""
        p = self.prompt_token_ids
        self.full_prompt_token_ids = p
        self.prompt_token_ids = (
            TokenIds(p.array[:-num_tokens], p.trace) if isinstance(p, TokenIds) else p[:-num_tokens]
        )

    def token_span(self, start: int, end: int) -> Sequence[int]:
        """`token_ids`, without an int each where the prompt is a `TokenIds` (for hashing)."""
        if end <= len(self.prompt_token_ids):
            return span(self.prompt_token_ids, start, end)
        return self.token_ids(start, end)

    @property
    def is_remote_decode(self) -> bool:
        """A prefill-engine request whose KV a decode engine will pull (blocks held after finishing)."""
        return self.kv_transfer_params is not None and self.kv_transfer_params.do_remote_decode

    def holds_kv_after(self, reason: FinishedReason) -> bool:
        """Whether its blocks outlive it, for a peer to pull: a prefill request that finished its
        prompt (vLLM: FINISHED_LENGTH_CAPPED) for its decode engine; bidirectional, decode's turn that
        ended by length or stop (an agent's tool call ends with EOS) for the conversation's next turn."""
        if not self.is_remote_decode:
            return False
        if self.is_conversation_turn:
            return reason in ("length", "stop")
        return reason == "length"

    @property
    def is_conversation_turn(self) -> bool:
        """Bidirectional: a decode-engine request of a conversation, whose blocks it keeps when it ends
        for the next turn's pull back. A cache, not a promise: they give way when blocks run short."""
        return self.is_remote_decode and self.is_remote_prefill and not self.is_pull_back

    @property
    def is_remote_prefill(self) -> bool:
        """A decode-engine request whose prompt KV comes from a prefill engine."""
        return self.kv_transfer_params is not None and self.kv_transfer_params.do_remote_prefill

    @property
    def is_pull_back(self) -> bool:
        """A prefill-engine request of a conversation's later turn that pulls back, from the decode
        engine of the turn before, the blocks of that turn it lacks (bidirectional)."""
        return self.kv_transfer_params is not None and self.kv_transfer_params.pull_back

    @property
    def remote_kv_end(self) -> int:
        """Tokens up to which the remote KV reaches: decode, all of the prompt but the last token (it
        recomputes that one for the logits of the first output token); a pull back, the tokens of the
        leading blocks of decode's sequence that it takes (`pull_back_tokens`)."""
        return self.pull_back_tokens if self.is_pull_back else self.num_prompt_tokens - 1

    @property
    def kv_load_failed(self) -> bool:
        """Its remote KV failed to load (`PDConnectorScheduler.recompute_instead`): it computes those
        tokens here instead, none are external."""
        return self.times.handoff.kv_load_failed or self.times.handoff.kv_pull_back_failed

    @property
    def num_external_computed_tokens(self) -> int:
        """Prompt tokens whose KV comes from outside this engine's GPU prefix cache: another engine's,
        up to `remote_kv_end`, less what this engine's own prefix cache held; or its offload tiers'."""
        if not self.is_remote_prefill:  # its tiers', as of its first admission (as num_cached_tokens)
            return self.times.offload_load.num_tokens
        if self.kv_load_failed:
            return 0
        return max(0, self.remote_kv_end - self.times.num_cached_tokens)
