"""What is sent: synthetic load, generated conversations, replayed traces."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from emulation.config.strict import STRICT


def _check_window(window: tuple[float, float] | None) -> tuple[float, float] | None:
    if window is not None and not 0 <= window[0] < window[1]:
        raise ValueError("must be [start, end) with 0 <= start < end")
    return window


def _check_tool(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool.get("function")
    if (
        tool.get("type", "function") != "function"
        or not isinstance(fn, dict)
        or not isinstance(fn.get("name"), str)
    ):
        raise ValueError("expected {type: function, function: {name: NAME, ...}}")
    return tool


@dataclass(frozen=True)
class WorkloadConfig:
    __pydantic_config__ = STRICT

    kind: Literal["synthetic", "trace", "multi_turn"] = "synthetic"
    """synthetic: random prompts of fixed lengths, or drawn around them (the guide's `vllm bench serve
    --dataset random`); trace: the sessions of `replay.trace`; multi_turn: conversations as
    `multi_turn` describes them (the fields below apply to synthetic only, but num_warmup_requests
    and output_policy)."""
    rate: Annotated[float, Field(gt=0)] = 0.2
    """Offered load, requests per emulated second (Poisson arrivals); not used with max_concurrency."""
    max_concurrency: Annotated[int | None, Field(ge=1)] = None
    """Closed loop, as `vllm bench serve --max-concurrency N` (at its default --request-rate inf) and
    genai-perf's --concurrency: N requests in flight, the next one sent the moment one finishes or
    fails, num_requests in all; `rate` is then not used for arrivals. A request's clock starts when
    it is sent: its arrival_s is that moment, and its TTFT counts every wait after it (rendering, the
    proxy, an engine's waiting queue). None: open loop, Poisson arrivals at `rate`. Synthetic
    workloads only (a trace's closed loop is replay.max_sessions)."""
    num_requests: Annotated[int, Field(ge=1)] = 100
    """Requests sent in all, num_warmup_requests among them."""
    num_warmup_requests: Annotated[int, Field(ge=0)] = 0
    """The first K requests sent (any kind: the earliest arrivals) are a warm-up: sent like the others
    (under max_concurrency they take slots), kept in the results table (its `warmup` column True) and
    left out of every summary figure. `vllm bench serve --num-warmups W --num-prompts P` is
    num_requests W + P with K = W, except that vLLM's warm-ups all finish before the measured requests
    start."""
    prompt_len: Annotated[int, Field(ge=1)] = 8192
    """Prompt tokens per request (with random_range_ratio: the nominal length)."""
    output_len: Annotated[int, Field(ge=1)] = 256
    """Output tokens per request (max_tokens, EOS ignored; with random_range_ratio: the nominal
    length)."""
    random_range_ratio: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """R: each request's prompt and output lengths drawn uniformly from the integers
    [floor(L x (1 - R)), ceil(L x (1 + R))] of their nominal L (outputs at least 1), as
    `vllm bench serve --dataset-name random --random-range-ratio R` draws them; seeded by `seed`.
    0: every request of prompt_len and output_len exactly. Lengths uniform over [a L, b L] are nominal
    (a + b) / 2 x L and R = (b - a) / (b + a): InferenceX's 0.8 to 1.0 of L is prompt_len 0.9 L and
    R 0.1111 (1/9)."""
    output_policy: Literal["forced", "greedy"] = "forced"
    """forced: emit the workload's answer tokens; greedy: argmax of the runner's real logits."""
    images_per_request: str = "constant:0"
    """Images in each request's prompt, a distribution (`constant:4`, `uniform:1:4`; see
    multi_turn): each adds its visual tokens to prompt_len's text. Needs a vision-language target."""
    image_tokens: Annotated[int, Field(ge=1)] = 400
    """Visual tokens per image (a square grid: 400 is 20 x 20 tokens, 40 x 40 patches, a 560-pixel
    image in Qwen2.5-VL's processor)."""
    text_only_fraction: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Share of requests without images."""
    image_reuse: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Chance that an image is one an earlier request sent (the same hash: encoder cache hits)."""


@dataclass(frozen=True)
class MultiTurnConfig:
    """Synthetic conversations (workload.kind=multi_turn), in the shape of vLLM's
    benchmarks/multi_turn generator; lengths are distributions (`constant:N`, `uniform:LO:HI`,
    `lognormal:MEAN:SIGMA`, `zipf:A`, `poisson:MEAN`, each optionally `:max=M`). The defaults are
    vLLM's example; `testbed replay --scenario six-turn` is 6 turns of 3,600 + 400 then 600 / 400."""

    __pydantic_config__ = STRICT

    num_conversations: Annotated[int, Field(ge=1)] = 32
    num_turns: str = "uniform:6:9"
    """Turns per conversation (user messages, each answered)."""
    common_prefix_tokens: Annotated[int, Field(ge=0)] = 500
    """A prefix every conversation's first prompt starts with (a shared system prompt)."""
    prefix_tokens: str = "lognormal:1000:0.5:max=5000"
    """Each conversation's own prefix on its first turn (a document, a task)."""
    user_tokens: str = "uniform:120:160"
    """Each user message."""
    output_tokens: str = "uniform:80:120"
    """Each answer (max_tokens; EOS ignored)."""
    think_s: str = "constant:0"
    """Seconds between an answer and the next user message."""
    conversation_rate: Annotated[float, Field(gt=0)] = 1.0
    """New conversations per second (Poisson)."""
    history: Literal["generated", "model"] = "generated"
    """generated: each turn's prompt repeats the generator's own answers (forced answers match it);
    model: it repeats the answers the model actually gave (greedy: real logits), so a wrong KV reuse
    changes every later turn."""
    strip_answer_tokens: Annotated[int, Field(ge=0)] = 0
    """history=model: leave each answer's first N tokens out of the history (a template dropping past
    reasoning: the next prompt is no longer a prefix of what decode generated)."""
    rewrite_answer_tokens: Annotated[int, Field(ge=0)] = 0
    """history=model: replace each answer's last N tokens in the history by others of the same count
    (an agent harness re-serialising the tool call an answer ends with: same length, other tokens)."""


@dataclass(frozen=True)
class ReplayConfig:
    """How a trace is replayed (workload.kind=trace)."""

    __pydantic_config__ = STRICT

    trace: str | None = None
    """The trace: a file, or a directory of WEKA session files."""
    format: Literal["auto", "mooncake", "azure", "weka", "swe-agent", "servegen"] = "auto"
    """auto: from the name (`.traj.json` or a directory of them: swe-agent; a directory of
    `chunk-*-trace.csv`: servegen; `.jsonl`: mooncake; `.csv`: azure; `.json` or a directory: weka),
    else from the first line."""
    clients: tuple[int, ...] | None = None
    """servegen: the clients (chunk ids) to sample; None: all of the directory's."""
    timing: Literal["think", "original", "api-scaled"] = "think"
    """When a session's next turn goes, after the previous one finished. think: its think time;
    original: at its trace time if later; api-scaled: the previous send + its API time x
    api_time_scale + think time, if later. One-turn sessions always go at their timestamps."""
    speedup: Annotated[float, Field(gt=0)] = 1.0
    """Divides every trace time and delay (2: twice the offered load)."""
    api_time_scale: Annotated[float, Field(ge=0)] = 1.0
    """api-scaled timing: the share of each original call's duration kept between sends."""
    window_s: Annotated[tuple[float, float] | None, AfterValidator(_check_window)] = None
    """Replay only sessions starting in [start, end) trace seconds, shifted to start at 0 (servegen:
    sample arrivals in it; None there: the chosen clients' busiest 600 s)."""
    max_turns: Annotated[int | None, Field(ge=1)] = None
    """Replay at most each session's first N turns (vLLM's multi-turn benchmark: --max-turns)."""
    max_sessions: Annotated[int | None, Field(ge=1)] = None
    """Most top-level sessions running at once (a closed-loop user count); None: no cap."""
    session_salt: bool = False
    """Give each session private blocks (no prefix shared across sessions), as one replayed user per
    trace session on a shared server would have."""
    history: Literal["trace", "model"] = "trace"
    """Chat traces: trace: each turn sends the trace's messages; model: each turn sends the messages the
    conversation really had, the answer the server gave (content, reasoning, tool calls) in place of
    the trace's, then the messages the trace adds after it (an agent harness's loop; `--target`)."""
    harness_edit: Literal["none", "reserialize_tool_calls"] = "none"
    """history=model: how the harness changes an answer before sending it back. reserialize_tool_calls:
    every tool call's arguments parsed and dumped compact (`{"a":1}` for `{"a": 1}`), as harnesses that
    keep calls as objects do: the next prompt is no longer a prefix of what decode generated."""
    tools: tuple[Annotated[dict[str, Any], AfterValidator(_check_tool)], ...] | None = None
    """OpenAI tool definitions sent with every chat request (an agent acting through function calls:
    the server's answers then call them, and harness_edit has calls to re-serialise)."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Sent with every chat request (vLLM's extension), e.g. `{keep_past_reasoning: true}` (the testbed's
    template) or `{enable_thinking: false}`."""
