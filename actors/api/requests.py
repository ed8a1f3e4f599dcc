"""OpenAI requests into token-ID requests for the proxy: limits, token-ID checks, the forced answer.

Choosing the output is the emulated model's job, not the render tier's: under the forced output policy
every request gets its answer here, from this process's copy of the tokenizer (`answers`).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import numpy as np

from actors.api.errors import ApiError
from actors.api.protocol import ChatCompletionRequest, CompletionRequest, GenerateRequest
from emulation.config import TestbedConfig
from messages import ClientRequest, KVTransferParams, RenderSpec, token_ids_valid
from messages.kv_transfer_params import InvalidKVTransferParams
from workloads.answers import forced_answer_ids, forced_answer_text

if TYPE_CHECKING:
    from actors.render.render import Render


class RequestBuilder:
    def __init__(self, cfg: TestbedConfig, answers: Render) -> None:
        """`answers`: a tokenizer for the workload's forced answers and stop IDs."""
        self.cfg = cfg
        self.answers = answers

    def chat(
        self, req: ChatCompletionRequest, prompt: list[int], spec: RenderSpec, arrival_s: float
    ) -> ClientRequest:
        """The token-ID request for a rendered chat."""
        max_tokens = self._max_tokens(req.requested_max_tokens, len(prompt))
        thinking = spec.template_kwargs.get("enable_thinking", True) is not False
        forced = self._forced_answer(max_tokens, prompt, spec.messages, spec.tools, thinking)
        creq = self._request("chatcmpl", arrival_s, prompt, max_tokens, forced, [self.answers.eos_token_id])
        creq.render = spec
        creq.reuse_prompt_token_ids = self.reusable(req)
        creq.session_id = req.conversation_id
        return creq

    def completion(self, req: CompletionRequest, prompt: list[int], arrival_s: float) -> ClientRequest:
        if not prompt:
            raise ApiError(400, "prompt: must not be empty", "prompt")
        self.transfer_params(req)  # checked, though a completion has no use for it
        max_tokens = self._max_tokens(req.max_tokens, len(prompt))
        chat = [{"role": "user", "content": str(req.prompt)}]
        forced = self._forced_answer(max_tokens, prompt, chat, None, reasoning=False)
        creq = self._request("cmpl", arrival_s, prompt, max_tokens, forced, [self.answers.eos_token_id])
        creq.session_id = req.conversation_id
        return creq

    def generate(self, req: GenerateRequest, arrival_s: float) -> ClientRequest:
        ids = self.check_token_ids(req.token_ids, "token_ids")
        max_tokens = self._max_tokens(req.sampling_params.max_tokens, len(ids))
        # token IDs in, token IDs out: no stop on the render tier's EOS
        return self._request("gen", arrival_s, ids, max_tokens, self._forced_answer(max_tokens, ids), [])

    @staticmethod
    def _request(
        kind: str,
        arrival_s: float,
        prompt: list[int],
        max_tokens: int,
        forced: list[int] | None,
        stop_token_ids: list[int],
    ) -> ClientRequest:
        return ClientRequest(
            f"{kind}-{uuid.uuid4().hex[:16]}", arrival_s, prompt, max_tokens, forced, stop_token_ids
        )

    def _forced_answer(
        self,
        max_tokens: int,
        prompt: list[int],
        messages: list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
        reasoning: bool = True,
    ) -> list[int] | None:
        """The forced output policy's answer (None under greedy): for a chat or completion, words (or a
        call to the first tool) tokenized; for token IDs without text, a seeded draw of token IDs."""
        if self.cfg.workload.output_policy != "forced":
            return None
        if messages is None:
            rng = np.random.default_rng([self.cfg.seed, len(prompt), sum(prompt)])
            return list(rng.integers(0, self.cfg.runner.vocab_size, max_tokens).tolist())
        text = forced_answer_text(messages, tools, self.cfg.seed, max_tokens, reasoning)
        render = self.answers
        return forced_answer_ids(text, render.render_text, max_tokens, render.eos_token_id, bool(tools))

    def check_token_ids(self, ids: Any, param: str) -> list[int]:
        vocab = self.cfg.runner.vocab_size
        if not token_ids_valid(ids, vocab):
            raise ApiError(400, f"{param}: token IDs must be a list of ints in [0, {vocab})", param)
        return list(ids)

    @staticmethod
    def reusable(req: ChatCompletionRequest) -> bool:
        """Whether prompt token IDs rendered before can stand for rendering this request again."""
        return not req.echo and all(m.is_text for m in req.messages)

    def transfer_prompt(self, req: ChatCompletionRequest) -> list[int] | None:
        """Checked prompt token IDs from the request's `kv_transfer_params`, if it may use them."""
        params = self.transfer_params(req)
        if params is None or params.prompt_token_ids is None:
            return None
        ids = self.check_token_ids(params.prompt_token_ids, "kv_transfer_params.prompt_token_ids")
        return ids if self.reusable(req) and ids else None

    @staticmethod
    def transfer_params(req: ChatCompletionRequest | CompletionRequest) -> KVTransferParams | None:
        """The request's `kv_transfer_params` (the JSON object, only here), or a 400 naming the field."""
        if req.kv_transfer_params is None:
            return None
        try:
            return KVTransferParams.from_json(req.kv_transfer_params)
        except InvalidKVTransferParams as e:
            raise ApiError(400, str(e), e.param) from None

    def _max_tokens(self, requested: int | None, num_prompt: int) -> int:
        limit = self.cfg.scheduler.max_model_len
        max_tokens = (
            requested if requested is not None else min(self.cfg.workload.output_len, limit - num_prompt)
        )
        if num_prompt + max_tokens > limit:
            raise ApiError(
                400,
                f"max_tokens={max_tokens}: this model's maximum context length is {limit} tokens and the "
                f"prompt has {num_prompt}; allowed: at most {max(0, limit - num_prompt)}",
                "max_tokens",
            )
        return max_tokens
