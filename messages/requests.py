"""A request on its way: what the front end renders, the proxy sends, an engine records and streams."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from messages.kv import KVEvents
from messages.kv_transfer_params import KVTransferParams
from messages.multimodal import MultiModalItem
from messages.token_ids import PromptIds, TokenIds

FinishedReason = Literal["length", "stop", "abort", "error", "rejected"]
"""vLLM's reasons, and `rejected`: refused by an admission limit (vLLM's queue limits, or the gateway's
`scheduler.max_waiting` / `max_queue_time_s`), nothing computed."""


def token_ids_valid(ids: object, vocab_size: int) -> bool:
    """A token-ID list an engine can compute: ints in [0, vocab_size) (checked at the HTTP edge, and by
    engines, since a bad ID would break the runner's embedding lookup)."""
    if isinstance(ids, TokenIds):  # ints by construction
        return not ids or (min(ids.array) >= 0 and max(ids.array) < vocab_size)
    if not isinstance(ids, list) or not ids:
        return isinstance(ids, list)
    return set(map(type, ids)) == {int} and min(ids) >= 0 and max(ids) < vocab_size  # C loops: long prompts


@dataclass
class RenderedPrompt:
    """render -> front end: a chat rendered to the prompt's token IDs, and its images."""

    token_ids: list[int]
    mm_items: list[MultiModalItem] = field(default_factory=list)


@dataclass
class EngineRequest:
    """proxy -> engine: one request in token IDs (engines never see text)."""

    request_id: str
    """Correlates outputs, KV handoff and results across actors."""
    prompt_token_ids: PromptIds
    """The prompt the engine computes; in P/D decode receives it so it never re-renders."""
    max_tokens: int
    """Output tokens to produce (1 on a prefill engine)."""
    arrival_time_s: float | None = None
    """Emulated time the request reaches the engine (None: when it does). The engine neither schedules
    it earlier nor counts the real hop between actors, so senders may send ahead of time."""
    forced_output_token_ids: list[int] | None = None
    """The forced output policy's answer; None means greedy (argmax of the runner's logits)."""
    kv_transfer_params: KVTransferParams | None = None
    """vLLM's P/D contract: `do_remote_decode` to prefill; the prefill's answer to decode (where the
    KV is)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Sampling one of these ends the request with finished_reason 'stop' (the tokenizer's EOS)."""
    mm_items: list[MultiModalItem] = field(default_factory=list)
    """The prompt's images (block hashes over their positions include their hashes)."""


OFFLOAD_TIERS = ("host", "disk", "shared")
"""An engine's KV offload tiers, in lookup order, as `OffloadLoad` names them (`num_<tier>_tokens`)."""


@dataclass
class KVHandoffTimes:
    """A request's KV handoff into this engine (decode's prompt from prefill; bidirectional, prefill's
    pull back of decode's last turn), written by the engine's P/D connector alone: its scheduler half
    stamps the plan and the notice, its worker half the move."""

    kv_blocks_ready_s: float | None = None
    """Blocks were allocated for the remote KV (no transfer starts before)."""
    kv_transfer_start_s: float | None = None
    """The handoff began: at blocks_ready (pull), or once prefill finished too (push)."""
    kv_transfer_done_s: float | None = None
    """The emulated transfer completed."""
    kv_wire_start_s: float | None = None
    """The sender's link began sending it (after the transfers queued before it)."""
    kv_wire_s: float = 0.0
    """Emulated seconds its bytes occupied the link."""
    kv_noticed_s: float | None = None
    """The engine noticed the completed transfer (a step boundary or push notification)."""
    kv_bytes: int = 0
    """Target-model KV bytes moved."""
    state_bytes: int = 0
    """Hybrid targets: the SSM state's bytes moved beside `kv_bytes` (a fixed size a request, whatever
    its prompt's length; page padding not sent)."""
    kv_pull_back_failed: bool = False
    """Bidirectional: decode's blocks of the last turn were gone (expired, or its engine died), so
    prefill computed those tokens again."""
    kv_load_failed: bool = False
    """Decode side: the prompt's KV failed to load, so this engine computed the prompt itself
    (kv_transfer.load_failure_policy=recompute)."""


@dataclass(frozen=True)
class OffloadLoad:
    """What a request's first admission loaded from the engine's offload tiers after its GPU prefix hit
    (it waited meanwhile), written whole by the engine's offloading connector."""

    num_host_tokens: int = 0
    """Prompt tokens loaded from this engine's host-memory offload tier."""
    num_disk_tokens: int = 0
    """Prompt tokens loaded from this engine's disk offload tier."""
    num_shared_tokens: int = 0
    """Prompt tokens loaded from the deployment's shared KV store."""
    offload_load_start_s: float | None = None
    """Its blocks were allocated and the load began."""
    offload_load_done_s: float | None = None
    """The load completed (emulated; the engine notices it at a step boundary)."""
    offload_load_bytes: int = 0
    """Target-model KV bytes loaded."""

    @property
    def num_tokens(self) -> int:
        """Prompt tokens loaded, every tier's."""
        return self.num_host_tokens + self.num_disk_tokens + self.num_shared_tokens


@dataclass(frozen=True)
class OffloadStore:
    """What the engine's offloading connector stored of a request's blocks when it ended, written whole
    by it."""

    offload_store_bytes: int = 0
    """Target-model KV bytes of its blocks the tiers lacked, summed over the tiers."""
    offload_store_done_s: float | None = None
    """The last of those stores completed (emulated; its blocks are hits from then on)."""


@dataclass
class RequestTimes:
    """engine -> proxy with the final output: the engine-side life of a request, for results. The step
    loop and its scheduler write its own fields; each KV connector its record (`handoff`,
    `offload_load`, `offload_store`)."""

    queued_s: float
    """Entered the engine's queue."""
    first_scheduled_s: float | None = None
    """First step that computed one of its tokens."""
    scheduled_s: float | None = None
    """Last admitted from the queue (vLLM's SCHEDULED event; a preempted request is admitted again)."""
    first_token_s: float | None = None
    """This engine emitted the request's first token (engine-level TTFT counts from `queued_s`)."""
    last_token_s: float | None = None
    """This engine's latest token so far (its last one once finished)."""
    finished_s: float | None = None
    num_cached_tokens: int = 0
    """Prompt tokens served from the local prefix cache."""
    num_external_tokens: int = 0
    """Prompt tokens whose KV came from another engine (decode: from prefill; prefill, bidirectional:
    pulled back from decode's last turn of the conversation)."""
    num_preemptions: int = 0
    handoff: KVHandoffTimes = field(default_factory=KVHandoffTimes)
    """Its KV handoff into this engine (none: every field unset)."""
    offload_load: OffloadLoad = OffloadLoad()
    """What its first admission loaded from the offload tiers (none: every field unset)."""
    offload_store: OffloadStore = OffloadStore()
    """What the offload tiers stored of it when it ended (none: every field unset)."""


@dataclass
class EngineOutput:
    """engine -> proxy: new tokens of one request since the last output, stamped in emulated time.

    Streams are coalesced: one output may carry several steps' tokens when the consumer is behind.
    """

    request_id: str
    new_token_ids: list[int]
    token_times_s: list[float]
    """Emulated time each token was emitted (its step's end)."""
    finished_reason: FinishedReason | None = None
    kv_transfer_params: KVTransferParams | None = None
    """From a prefill engine on finish: where the KV is, for the decode engine to pull."""
    times: RequestTimes | None = None
    """On the final output only."""
    error: str | None = None
    """Why a request ended with finished_reason 'error'."""
    kv_events: KVEvents | None = None
    """The engine's prefix-cache changes since its last output (any request's), for a KV-aware router:
    piggybacked on the outputs the engine streams anyway, so they cost no message of their own."""
    rejected_by: str | None = None
    """Why a request ended `rejected`: the `scheduler.` limit that refused it (`max_num_queued_reqs`,
    `max_num_queued_tokens`: vLLM's; `max_waiting`, `max_queue_time_s`: a gateway's)."""


@dataclass
class RenderSpec:
    """How to render a chat request: sent with it so that any render replica can (re)render it."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    """chat_template_kwargs, e.g. enable_thinking, keep_past_reasoning."""


@dataclass
class ClientRequest:
    """front end -> proxy: a request rendered to token IDs (engines never see text)."""

    request_id: str
    arrival_s: float
    """Emulated send time from the trace or generator."""
    prompt_token_ids: PromptIds
    """A trace's synthesized prompt is a `TokenIds` (ints made only where read)."""
    max_tokens: int
    forced_output_token_ids: list[int] | None = None
    """The workload's answer, emitted under the forced output policy; None for greedy."""
    stop_token_ids: list[int] = field(default_factory=list)
    render: RenderSpec | None = None
    """P/D: how the decode side renders the prompt if it cannot reuse prefill's token IDs."""
    reuse_prompt_token_ids: bool = True
    """P/D: decode takes the prompt IDs prefill returns in kv_transfer_params; False (non-text content,
    echo) renders again."""
    render_s: float = 0.0
    """Emulated seconds the front end took to render it into token IDs: engines see it that much after
    `arrival_s`, and the client's TTFT (from `arrival_s`) counts it, as vLLM's does."""
    encode_s: float = 0.0
    """E/P/D: emulated seconds from rendered to the engines seeing it (its images queued, encoded on
    the encoder pool and moved to prefill; part of TTFT)."""
    ec_transfer_s: float = 0.0
    """E/P/D: of `encode_s`, the EC transfer of the image whose embeddings landed last."""
    mm_items: list[MultiModalItem] = field(default_factory=list)
    """The prompt's images, as the render tier found them."""
    session_id: str | None = None
    """The replayed session (conversation, agent) it belongs to: the key of session-affinity routing
    (vLLM's multi-turn benchmark sends it as `conversation_id`); None outside sessions."""
    turn: int | None = None
    """Its index among its session's turns (0 first), carried into results."""
    parent_session_id: str | None = None
    """The session that spawned its session (a sub-agent's parent), carried into results."""
