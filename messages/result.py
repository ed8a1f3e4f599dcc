"""A request's whole story as the client saw it: one row of the results table."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from messages.latency import handoff_parts, request_latencies
from messages.requests import ClientRequest, FinishedReason, RequestTimes


@dataclass
class PrefillLeg:
    """P/D: a request's prompt on the prefill pool, written by the pool alone
    (`EnginePool.prefill_on_a_live_engine`)."""

    prefill_engine: str | None = None
    """The prefill engine it last ran on."""
    num_prefill_retries: int = 0
    """Prefill engines that died or timed out under it before one finished its prompt."""
    num_prefill_timeouts: int = 0
    """Prefill engines that gave no answer within router.prefill_timeout_s (aborted there)."""
    prefill_done_s: float | None = None
    """The prefill engine emitted its token (its KV is ready to move)."""
    prefill_times: RequestTimes | None = None
    """The prefill engine's record of the request (its prefix-cache hits among them)."""


@dataclass
class ServerRecord:
    """Replayed against a server (`replay --target`): what it said of a request, written by the replay
    client alone (`workloads.openai_target`)."""

    server_request_id: str | None = None
    """The id it gave the request, to match its records."""
    server_num_output_tokens: int | None = None
    """The tokens it says it generated (`usage.completion_tokens`; a streamed chunk may carry several)."""
    server_num_cached_tokens: int | None = None
    """The prompt tokens it served from its prefix cache (`usage.prompt_tokens_details.cached_tokens`;
    vLLM sends it with --enable-prompt-tokens-details)."""
    answer_message: dict[str, Any] | None = None
    """The assistant message it streamed (content, reasoning_content, tool_calls), which the client
    sends back as history (`replay.history=model`)."""


@dataclass
class RequestResult:
    """proxy -> driver: one request's whole story as the client saw it (a row of the results table)."""

    request_id: str
    arrival_s: float
    num_prompt_tokens: int
    max_tokens: int
    finished_reason: FinishedReason | None = None
    error: str | None = None
    rejected_by: str | None = None
    """Rejected: the `scheduler.` limit that refused it (`EngineOutput.rejected_by`)."""
    output_token_ids: list[int] = field(default_factory=list)
    token_times_s: list[float] = field(default_factory=list)
    """Emulated time each output token reached the client."""
    engine: str | None = None
    """The engine that produced the output (the decode engine in P/D)."""
    times: RequestTimes | None = None
    """The producing engine's record of the request (None if it never finished there)."""
    prefill: PrefillLeg = field(default_factory=PrefillLeg)
    """P/D: its prompt on the prefill pool."""
    render_s: float = 0.0
    """Emulated seconds of rendering before any engine saw it (part of TTFT)."""
    encode_s: float = 0.0
    """E/P/D: emulated seconds of encoding its images and moving them to prefill (part of TTFT)."""
    ec_transfer_s: float = 0.0
    """E/P/D: of `encode_s`, the last-landing image's embeddings moving encoder -> prefill."""
    session_id: str | None = None
    turn: int | None = None
    parent_session_id: str | None = None
    """The request's place in a replayed trace (`ClientRequest`'s fields of the same names)."""
    server: ServerRecord = field(default_factory=ServerRecord)
    """Replayed against a server (`replay --target`): what it said of the request."""

    @cached_property
    def latencies(self) -> dict[str, float]:
        """The finished request's client-side latencies (`messages.latency.LATENCY_COLUMNS`; NaN where
        undefined), computed once, where it is first read (its proxy's metrics, or the results table),
        and carried with the result from there: read it only once the request has finished."""
        return request_latencies(self.arrival_s, self.token_times_s)

    @cached_property
    def handoff_parts(self) -> dict[str, float] | None:
        """P/D: the finished request's KV handoff in parts (`messages.latency.HANDOFF_PARTS`), once."""
        return handoff_parts(self.prefill.prefill_done_s, self.times)

    def fail(self, error: str) -> None:
        """The request failed (`error` says why): recorded, never raised, so it is reported, not lost."""
        self.finished_reason = "error"
        self.error = error

    def end_stream(self) -> None:
        """Its stream ended: if the request had not finished, the client closed the stream (an abort)."""
        if self.finished_reason is None:
            self.finished_reason = "abort"
            self.error = "the client closed the stream"

    @classmethod
    def for_request(cls, creq: ClientRequest) -> RequestResult:
        """The record of `creq` that whoever serves it (proxy, API server, replay client) fills in."""
        return cls(
            creq.request_id,
            creq.arrival_s,
            len(creq.prompt_token_ids),
            creq.max_tokens,
            render_s=creq.render_s,
            session_id=creq.session_id,
            turn=creq.turn,
            parent_session_id=creq.parent_session_id,
        )
