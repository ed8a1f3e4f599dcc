"""The model runner: real forward passes of the runner model over paged KV.

All tokens of a step (prefill chunks and decodes of many requests) go through the projections and MLPs
as one packed batch; attention runs per request against that request's KV. The HF modules (norms,
projections, rotary embedding, MLP or MoE block) do the math, in each architecture's order
(`runner_layers.py`: Qwen2, Qwen3-MoE); only the attention plumbing is ours, because transformers has no
CPU path for a varlen batch over a paged cache. With attention-FFN disaggregation the sparse MoE blocks
run on FFN ranks instead (`ffn_client.py`): the normed hidden states cross, the residual stays here.
`tests/test_runner.py` and `tests/test_moe_runner.py` pin the result to the model's own `forward`
(allclose); `tests/test_afd_runner.py` pins the disaggregated runner to the collocated one.

KV storage, two layouts of the same values::

    pool     [num_blocks * block_size, L, 2, H_kv, D]   token slots addressed through block ids; what the
                                                        prefix cache and the KV handoff read and write
    working  [L, 2, H_kv, capacity, D] per request      contiguous, so attention reads views, not gathers

A request's working copy is filled from the pool when it is first scheduled (prefix hits, received KV)
and every step writes new KV to both.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.nn.functional import scaled_dot_product_attention
from transformers import PreTrainedModel

from actors.engine.runner.layers import Rotary, attention_inputs, is_sparse, mlp, rotary_of

if TYPE_CHECKING:
    from actors.engine.runner.ffn_client import AfdConnector
    from messages import SsmState


@dataclass
class RunnerInput:
    """One request's share of a step."""

    request_id: str
    token_ids: list[int]
    start_pos: int
    """Position of token_ids[0]; tokens before it are in the KV cache."""
    block_ids: list[int]
    capacity: int
    """Most tokens this request can reach (prompt + max_tokens): sizes its working copy once."""
    needs_logits: bool
    embeds: list[tuple[int, np.ndarray]] = field(default_factory=list)
    """Image embeddings standing in for placeholder tokens: (index into token_ids, rows)."""
    state_block: int | None = None
    """Hybrid models: the block the request's SSM state as of this step's end is saved to (after the
    step); None: not saved."""
    state_source_block: int | None = None
    """Hybrid models: the block holding its SSM state as of start_pos (a prefix hit's or a received
    handoff's); read when the runner holds no working state for the request and start_pos > 0."""
    state_checkpoint: tuple[int, int] | None = None
    """Hybrid models: (position, block): also save its SSM state as of that position, within this
    step's tokens (start_pos, start_pos + len(token_ids)], to that block (a prompt's cached state)."""


class ModelRunner:
    def __init__(
        self,
        model: PreTrainedModel,
        *,
        num_blocks: int,
        block_size: int,
        num_threads: int = 1,
        ffn: AfdConnector | None = None,
    ) -> None:
        """`ffn` (attention-FFN disaggregation): the FFN ranks that compute every sparse layer's MoE
        block, the rest stays here; None: the model's own blocks compute here."""
        torch.set_num_threads(num_threads)
        self.ffn = ffn
        cfg = model.config
        self.model = model
        self.device = next(model.parameters()).device
        self.block_size = block_size
        self.attention_layers = self._attention_layers(model)
        """The model's layers with KV, in order: the pool's and working copies' L (every layer here)."""
        self.num_layers = len(self.attention_layers)
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.num_experts = int(getattr(cfg, "num_experts", 0) or 0)
        self.last_expert_counts: np.ndarray | None = None
        """Tokens the router sent to each expert of each layer in the last `execute` ([L, num_experts],
        a token counted once per expert it went to); None for a dense model."""
        # np.zeros maps lazily: only slots ever written take memory.
        self._pool_np = np.zeros(
            (num_blocks * block_size, self.num_layers, 2, self.num_kv_heads, self.head_dim), np.float32
        )
        self._pool = torch.from_numpy(self._pool_np)
        self._working: dict[str, torch.Tensor] = {}

    @staticmethod
    def _attention_layers(model: PreTrainedModel) -> list[int]:
        return list(range(model.config.num_hidden_layers))

    @functools.cached_property
    def _rotary(self) -> Rotary:
        """The architecture's rotary embedding, looked up when first applied."""
        return rotary_of(self.model.config.model_type)

    @property
    def vocab_size(self) -> int:
        """The loaded model's vocabulary: the token IDs it can embed."""
        return int(self.model.config.vocab_size)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 4

    def _slots(self, block_ids: list[int], start: int, end: int) -> torch.Tensor:
        pos = torch.arange(start, end)
        blocks = torch.tensor(block_ids, dtype=torch.long)[pos // self.block_size]
        return blocks * self.block_size + pos % self.block_size

    def _working_copy(self, item: RunnerInput) -> torch.Tensor:
        w = self._working.get(item.request_id)
        if w is None:
            w = torch.zeros(
                self.num_layers, 2, self.num_kv_heads, item.capacity, self.head_dim, device=self.device
            )
            if item.start_pos:
                w[:, :, :, : item.start_pos] = self._read(item.block_ids, item.start_pos).to(self.device)
            self._working[item.request_id] = w
        return w

    def _read(self, block_ids: list[int], num_tokens: int) -> torch.Tensor:
        """[L, 2, H, num_tokens, D] gathered from the pool."""
        return self._pool[self._slots(block_ids, 0, num_tokens)].permute(1, 2, 3, 0, 4)

    @torch.inference_mode()
    def execute(self, items: list[RunnerInput]) -> list[int | None]:
        """Compute every item's new tokens; returns the argmax next token where logits were asked for."""
        counts = None
        if self.num_experts:
            counts = torch.zeros(self.num_layers, self.num_experts, dtype=torch.long, device=self.device)
        sampled = self._execute(items, counts)
        self.last_expert_counts = None if counts is None else counts.cpu().numpy()
        return sampled

    def _execute(self, items: list[RunnerInput], counts: torch.Tensor | None) -> list[int | None]:
        """The step in one forward pass, or two: a request admitted with a prefix hit on blocks an
        earlier request of the same step computes (the scheduler caches blocks as it schedules them, as
        vLLM does) reads them once they are stored: it runs in a second pass. vLLM's kernels need none,
        as they write each layer's KV before any request of the step attends to it; a working copy is
        filled before the first layer."""
        now, later = self._split_same_step_hits(items)
        sampled = self._forward(now, counts)
        if not later:
            return sampled
        by_id = dict(zip((it.request_id for it in now), sampled, strict=True))
        by_id.update(zip((it.request_id for it in later), self._execute(later, counts), strict=True))
        return [by_id[it.request_id] for it in items]

    def _split_same_step_hits(self, items: list[RunnerInput]) -> tuple[list[RunnerInput], list[RunnerInput]]:
        """The items that can run now, and those whose first read of the pool (a new working copy)
        reaches a block an earlier item of this step writes."""
        now: list[RunnerInput] = []
        later: list[RunnerInput] = []
        written: set[int] = set()
        bs = self.block_size
        for it in items:
            reads = it.start_pos and it.request_id not in self._working
            if reads and not written.isdisjoint(it.block_ids[: -(-it.start_pos // bs)]):
                later.append(it)
            else:
                now.append(it)
            written.update(it.block_ids[it.start_pos // bs : -(-(it.start_pos + len(it.token_ids)) // bs)])
        return now, later

    def _forward(self, items: list[RunnerInput], counts: torch.Tensor | None) -> list[int | None]:
        """One forward pass of the packed batch; adds the router's choices to `counts` (MoE)."""
        m = self.model.model
        ids = torch.tensor([t for it in items for t in it.token_ids], dtype=torch.long, device=self.device)
        pos = torch.tensor(
            [p for it in items for p in range(it.start_pos, it.start_pos + len(it.token_ids))],
            dtype=torch.long,
            device=self.device,
        )
        works = [self._working_copy(it) for it in items]
        x = m.embed_tokens(ids)
        base = 0
        for it in items:  # an image's embeddings replace its placeholders' (the model sees the image)
            for at, rows in it.embeds:
                x[base + at : base + at + len(rows)] = torch.from_numpy(rows).to(x)
            base += len(it.token_ids)
        cos, sin = m.rotary_emb(x[None], pos[None])
        sizes = [(it.request_id, len(it.token_ids)) for it in items]
        ffn_rows = None if self.ffn is None else self.ffn.rows(sizes, x.device)  # (the same every layer)
        for li, layer in enumerate(m.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q, k, v = attention_inputs(attn, h, self.head_dim, cos, sin, self._rotary)
            x = x + attn.o_proj(self._attention(li, q, k, v, items, works, attn.scaling))
            h = layer.post_attention_layernorm(x)
            chosen: torch.Tensor | None
            if self.ffn is not None and ffn_rows is not None and is_sparse(layer.mlp):
                out, chosen = self.ffn.mlp(li, h, ffn_rows)  # AFD: the FFN ranks hold the experts
            else:
                out, chosen = mlp(layer.mlp, h)
            x = x + out
            if counts is not None and chosen is not None:
                counts[li] += torch.bincount(chosen.flatten(), minlength=self.num_experts)
        return self._store_and_sample(x, items, works)

    def _attention(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        items: list[RunnerInput],
        works: list[torch.Tensor],
        scaling: float,
    ) -> torch.Tensor:
        """One layer's attention for the packed batch: each request's new K/V into its working copy,
        its queries against all its keys so far; outputs packed again [num_tokens, heads * head_dim]."""
        outs = []
        offset = 0
        for it, w in zip(items, works, strict=True):
            n, p = len(it.token_ids), it.start_pos
            w[layer, 0, :, p : p + n] = k[0, :, offset : offset + n]
            w[layer, 1, :, p : p + n] = v[0, :, offset : offset + n]
            o = _attend(
                q[:, :, offset : offset + n],
                w[layer, 0, None, :, : p + n],
                w[layer, 1, None, :, : p + n],
                p,
                scaling,
            )
            outs.append(o[0].transpose(0, 1).reshape(n, self.num_heads * self.head_dim))
            offset += n
        return torch.cat(outs)

    def _store_and_sample(
        self, x: torch.Tensor, items: list[RunnerInput], works: list[torch.Tensor]
    ) -> list[int | None]:
        """Write the step's new KV to the pool; the argmax token where an item needs logits."""
        m = self.model.model
        last = []
        offset = 0
        for it, w in zip(items, works, strict=True):
            n, p = len(it.token_ids), it.start_pos
            new_kv = w[:, :, :, p : p + n].permute(3, 0, 1, 2, 4)
            self._pool[self._slots(it.block_ids, p, p + n)] = new_kv.cpu()  # the pool is host memory
            offset += n
            if it.needs_logits:
                last.append(offset - 1)
        sampled: list[int | None] = [None] * len(items)
        if last:
            logits = self.model.lm_head(m.norm(x[last]))
            tokens = logits.argmax(dim=-1).tolist()
            for i, tok in zip((i for i, it in enumerate(items) if it.needs_logits), tokens, strict=True):
                sampled[i] = tok
        return sampled

    def warm_up(self) -> None:
        """One short prefill and decode, so the first real step does not pay torch's one-time costs."""
        blocks = list(range(min(4, self._pool_np.shape[0] // self.block_size)))
        n = len(blocks) * self.block_size - 1
        self.execute([RunnerInput("warm-up", [0] * n, 0, blocks, n + 1, True)])
        self.execute([RunnerInput("warm-up", [0], n, blocks, n + 1, True)])
        self.release("warm-up")

    def release(self, request_id: str) -> None:
        """Drop a request's working copy (finished, preempted or aborted); its pool slots stay as cached."""
        self._working.pop(request_id, None)

    def read_kv(self, block_ids: list[int], num_tokens: int) -> np.ndarray:
        """A request's KV as [L, 2, H_kv, num_tokens, D] numpy (what a handoff sends)."""
        return self._read(block_ids, num_tokens).contiguous().numpy()

    def write_kv(self, block_ids: list[int], kv: np.ndarray) -> None:
        """Store received KV ([L, 2, H_kv, n, D]) into this engine's blocks."""
        n = kv.shape[3]  # kv may be a read-only view into Ray's object store: copy it with numpy
        self._pool_np[self._slots(block_ids, 0, n).numpy()] = kv.transpose(3, 0, 1, 2, 4)

    def read_state(self, block: int) -> SsmState | None:
        """The SSM state saved to `block`: none, this model has no SSM layers (a hybrid target run on it
        counts its states' blocks and bytes; `HybridRunner` holds them)."""
        return None

    def write_state(self, block: int, state: SsmState) -> None:
        """A received SSM state: nowhere to keep it in a model without SSM layers."""
        return

    def assert_empty(self) -> None:
        assert not self._working, f"runner still holds working KV of {list(self._working)}"


_FLASH_WITH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: int, scale: float) -> torch.Tensor:
    """Attention of n new queries at positions p.. over keys 0..p+n-1, causal at the end::

        keys   [0 ............ p)[p ......... p+n)
        query i  sees all of these   and these up to p+i

    A cached prefix plus a chunk runs as two flash calls (prefix unmasked, chunk causal) merged by their
    log-sum-exp: exact, and about twice as fast on CPU as one call with an explicit mask, which falls
    back to materialising the scores. sdpa returns no log-sum-exp, so this uses the CPU flash kernel.
    """
    n, gqa = q.shape[2], q.shape[1] != k.shape[1]
    if n == 1 or p == 0:
        return scaled_dot_product_attention(q, k, v, is_causal=n > 1, scale=scale, enable_gqa=gqa)
    if _FLASH_WITH_LSE is None or q.is_cuda:  # a GPU (or another torch): one masked call
        mask = (
            torch.arange(p + n, device=q.device)[None, :] <= (p + torch.arange(n, device=q.device))[:, None]
        )
        return scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    if gqa:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    o1, lse1 = _FLASH_WITH_LSE(q, k[:, :, :p], v[:, :, :p], 0.0, False, scale=scale)[:2]
    o2, lse2 = _FLASH_WITH_LSE(q, k[:, :, p:], v[:, :, p:], 0.0, True, scale=scale)[:2]
    m = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - m).unsqueeze(-1), torch.exp(lse2 - m).unsqueeze(-1)
    return (o1 * w1 + o2 * w2) / (w1 + w2)
