"""The OpenAI-compatible HTTP surface: request models, validated at the edge (errors: `errors.py`).

Requests accept the many fields real clients send (extra fields are ignored, as vLLM ignores sampling
knobs it does not use); the fields the testbed acts on are checked, and a bad value is a 400 naming the
field, the value and what is allowed.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ImageUrl(_Lenient):
    url: str


class ContentPart(_Lenient):
    type: Literal["text", "image_url"]
    """Text, or an image as a data URL (the render tier decodes it; nothing is fetched)."""
    text: str | None = None
    image_url: ImageUrl | None = None

    def for_template(self) -> dict[str, Any]:
        if self.type == "image_url":
            return {"type": "image_url", "image_url": {"url": self.image_url.url if self.image_url else ""}}
        return {"type": "text", "text": self.text or ""}


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    reasoning: str | None = None
    """An assistant turn's reasoning (vLLM's name); `reasoning_content`, the older name, is read too."""
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @property
    def is_text(self) -> bool:
        return not isinstance(self.content, list) or all(p.type == "text" for p in self.content)

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template reads it (text parts joined, images kept as parts;
        developer is system)."""
        content: str | list[dict[str, Any]] | None = self.content  # type: ignore[assignment]
        if isinstance(self.content, list):
            if self.is_text:
                content = "".join(p.text or "" for p in self.content)
            else:
                content = [p.for_template() for p in self.content]
        out: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": content,
        }
        reasoning = self.reasoning if self.reasoning is not None else self.reasoning_content
        if reasoning:
            out["reasoning_content"] = reasoning  # the name chat templates read
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


class StreamOptions(_Lenient):
    include_usage: bool = False


class ChatCompletionRequest(_Lenient):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[dict[str, Any]] | None = None
    n: int = Field(default=1, ge=1, le=1)
    chat_template_kwargs: dict[str, Any] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    """vLLM's P/D params, the JSON object: read as `KVTransferParams` (`RequestBuilder.transfer_params`)."""
    echo: bool = False
    conversation_id: str | None = None
    """The conversation this turn belongs to (vLLM's multi-turn benchmark sends it): session-affinity
    routing and bidirectional KV key on it."""

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Lenient):
    model: str
    prompt: str | list[int]
    max_tokens: int = Field(default=16, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False
    n: int = Field(default=1, ge=1, le=1)
    kv_transfer_params: dict[str, Any] | None = None
    """As in a chat completion (checked; a completion has no use for it)."""
    conversation_id: str | None = None
    """As in a chat completion: the conversation this request belongs to."""


class RenderRequest(_Lenient):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DerenderRequest(_Lenient):
    token_ids: list[int]


class SamplingParams(_Lenient):
    max_tokens: int = Field(default=16, ge=1)


class GenerateRequest(_Lenient):
    """`/inference/v1/generate`: token IDs in, token IDs out; no template, no parser."""

    token_ids: list[int] = Field(min_length=1)
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    stream: bool = False
