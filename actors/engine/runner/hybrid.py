"""The hybrid runner: real forward passes of Nemotron-H (Mamba2, attention, MoE and MLP layers).

It is `runner.py`'s ModelRunner for a hybrid model, whose paged KV, working copies, step passes and KV
handoff methods it inherits; only the layers differ. All tokens of a step go through the norms and the
MoE and MLP blocks as one packed batch; attention (no rotary embedding: the Mamba2 layers carry position)
runs per request against its KV, of the attention layers only::

    pool     [num_blocks * block_size, L_attn, 2, H_kv, D]   as ModelRunner's, L_attn = the `*` layers

A Mamba2 mixer runs per request on its own tokens ([1, n, hidden]) with that request's cache
(transformers' own `DynamicCache`, which the mixer reads and updates), so a prompt's next chunk, or a
decode, continues from the state the last step left. A state is the whole history up to a position:
unlike KV it cannot be cut at a shorter prefix, so it is saved by position, into a block::

    working state   per request, between its steps (dropped by `release`)
    state pool      block id -> SsmState, as of the end of a step whose item names `state_block`;
                    a request with no working state resuming at start_pos > 0 (a prefix hit, received
                    KV) reads `state_source_block`'s, which must be its state as of start_pos exactly
                    (the runner cannot tell: a state of another position computes silently wrong)

`tests/test_hybrid_runner.py` pins the result to the model's own `forward` (chunked, batched, handed off).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch.nn.functional import pad
from transformers import DynamicCache, PreTrainedModel
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHAttention, NemotronHMamba2Mixer

from actors.engine.runner.model_runner import ModelRunner, RunnerInput
from messages import SsmState


class HybridRunner(ModelRunner):
    """ModelRunner's interface, and the state pool's: `state_bytes`, `read_state`, `write_state`."""

    def __init__(
        self, model: PreTrainedModel, *, num_blocks: int, block_size: int, num_threads: int = 1
    ) -> None:
        """`model`: a NemotronHForCausalLM (`runner_arch.py` admits it). No attention-FFN disaggregation."""
        super().__init__(model, num_blocks=num_blocks, block_size=block_size, num_threads=num_threads)
        cfg = model.config
        self._attention_index = {layer: j for j, layer in enumerate(self.attention_layers)}
        """Model layer -> its index among the attention layers (the pool's and working copies' L)."""
        self.ssm_layers = [i for i, kind in enumerate(cfg.layers_block_type) if kind == "linear_attention"]
        self.num_experts = 0  # the router's choices are not counted: last_expert_counts stays None
        self._conv_shape = (
            cfg.conv_kernel - 1,
            cfg.mamba_num_heads * cfg.mamba_head_dim + 2 * cfg.n_groups * cfg.ssm_state_size,
        )
        self._ssm_shape = (cfg.mamba_num_heads, cfg.mamba_head_dim, cfg.ssm_state_size)
        self._states: dict[str, DynamicCache] = {}
        self._saved: dict[int, SsmState] = {}

    @staticmethod
    def _attention_layers(model: PreTrainedModel) -> list[int]:
        return [i for i, kind in enumerate(model.config.layers_block_type) if kind == "full_attention"]

    @property
    def state_bytes(self) -> int:
        """One request's state over all Mamba2 layers, as `read_state` ships it (conv K-1 inputs)."""
        per_layer = int(np.prod(self._conv_shape)) + int(np.prod(self._ssm_shape))
        return len(self.ssm_layers) * per_layer * 4

    def _split_same_step_hits(self, items: list[RunnerInput]) -> tuple[list[RunnerInput], list[RunnerInput]]:
        """ModelRunner's, and an item whose first read of the state pool is of a block an earlier item
        of this step saves its state to: the state exists after the first pass."""
        now, later = super()._split_same_step_hits(items)
        deferred = {it.request_id for it in later}
        saved: set[int] = set()
        for it in items:
            if self._reads_state(it) and it.state_source_block in saved:
                deferred.add(it.request_id)
            if it.state_block is not None:
                saved.add(it.state_block)
        if len(deferred) == len(later):
            return now, later
        now = [it for it in items if it.request_id not in deferred]
        return now, [it for it in items if it.request_id in deferred]

    def _reads_state(self, item: RunnerInput) -> bool:
        return bool(item.start_pos) and item.request_id not in self._states

    def _forward(self, items: list[RunnerInput], counts: torch.Tensor | None) -> list[int | None]:
        """One forward pass of the packed batch, layer by layer in the model's order."""
        if any(it.embeds for it in items):
            raise ValueError("the hybrid runner's model is text only: it takes no image embeddings")
        m = self.model.model
        ids = torch.tensor([t for it in items for t in it.token_ids], dtype=torch.long, device=self.device)
        works = [self._working_copy(it) for it in items]
        caches = [self._cache_of(it) for it in items]
        checkpoints: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        """Item index -> its Mamba2 layers' (conv, ssm) as of its checkpoint, layer by layer."""
        x = m.embeddings(ids)
        for li, layer in enumerate(m.layers):
            h = layer.norm(x)
            if li in self._attention_index:
                out = self._attention_layer(self._attention_index[li], layer.mixer, h, items, works)
            elif li in self.ssm_layers:
                out = self._mamba(li, layer.mixer, h, items, caches, checkpoints)
            else:
                out = layer.mixer(h)  # a MoE or MLP block: per token, the packed batch at once
            x = x + out
        for i, (it, cache) in enumerate(zip(items, caches, strict=True)):
            if it.state_checkpoint is not None:
                layers = checkpoints.get(i) or [self._layer_state(cache, li) for li in self.ssm_layers]
                self._saved[it.state_checkpoint[1]] = self._frozen_state(layers)
            if it.state_block is not None:
                self._saved[it.state_block] = self._snapshot(cache)
        return self._store_and_sample(x, items, works)

    def _attention_layer(
        self,
        j: int,
        attn: NemotronHAttention,
        h: torch.Tensor,
        items: list[RunnerInput],
        works: list[torch.Tensor],
    ) -> torch.Tensor:
        """Attention layer `j` (among the attention layers) of the packed batch: q, k, v projected (no
        biases, no norms, no rotation), then ModelRunner's per-request attention over the working copies."""
        n = h.shape[0]
        q, k, v = (
            p(h).view(n, -1, self.head_dim).transpose(0, 1)[None]
            for p in (attn.q_proj, attn.k_proj, attn.v_proj)
        )
        return attn.o_proj(self._attention(j, q, k, v, items, works, attn.scaling))

    def _mamba(
        self,
        li: int,
        mixer: NemotronHMamba2Mixer,
        h: torch.Tensor,
        items: list[RunnerInput],
        caches: list[DynamicCache],
        checkpoints: dict[int, list[tuple[torch.Tensor, torch.Tensor]]],
    ) -> torch.Tensor:
        """Mamba2 layer `li`: each request's tokens through the mixer with its own cache, packed again.
        A request whose checkpoint falls inside its tokens runs them in two calls, the layer's state
        between them kept for the checkpoint (exact: a chunk continues from the state it is given)."""
        outs = []
        offset = 0
        for i, (it, cache) in enumerate(zip(items, caches, strict=True)):
            n = len(it.token_ids)
            cut = n if it.state_checkpoint is None else it.state_checkpoint[0] - it.start_pos
            assert 0 < cut <= n, f"{it.request_id}: a checkpoint at {cut} of a step of {n} tokens"
            if cut < n:
                outs.append(mixer(h[None, offset : offset + cut], cache_params=cache)[0])
                checkpoints.setdefault(i, []).append(self._layer_state(cache, li))
                outs.append(mixer(h[None, offset + cut : offset + n], cache_params=cache)[0])
            else:
                outs.append(mixer(h[None, offset : offset + n], cache_params=cache)[0])
            offset += n
        return torch.cat(outs)

    def _store_and_sample(
        self, x: torch.Tensor, items: list[RunnerInput], works: list[torch.Tensor]
    ) -> list[int | None]:
        """The step's new KV to the pool (ModelRunner's, asked for no logits: its final norm is another
        model's); the argmax token where an item needs logits, through norm_f and the head."""
        super()._store_and_sample(x, [dataclasses.replace(it, needs_logits=False) for it in items], works)
        ends = np.cumsum([len(it.token_ids) for it in items]) - 1
        asked = [i for i, it in enumerate(items) if it.needs_logits]
        sampled: list[int | None] = [None] * len(items)
        if asked:
            logits = self.model.lm_head(self.model.model.norm_f(x[ends[asked].tolist()]))
            for i, tok in zip(asked, logits.argmax(dim=-1).tolist(), strict=True):
                sampled[i] = tok
        return sampled

    def _cache_of(self, item: RunnerInput) -> DynamicCache:
        """The request's working state: kept from its last step, read from the state pool when it
        resumes at start_pos > 0 without one, or fresh at its first token."""
        cache = self._states.get(item.request_id)
        if cache is None:
            cache = DynamicCache(config=self.model.config)
            if item.start_pos:
                self._restore(cache, self._saved_state(item))
            self._states[item.request_id] = cache
        return cache

    def _saved_state(self, item: RunnerInput) -> SsmState:
        block = item.state_source_block
        state = None if block is None else self._saved.get(block)
        if state is None:
            raise LookupError(
                f"request {item.request_id!r} resumes at token {item.start_pos} with no SSM state: "
                f"state_source_block={block} holds none"
            )
        return state

    def _restore(self, cache: DynamicCache, state: SsmState) -> None:
        """Fill a fresh cache with `state` through the cache's own updates. transformers keeps
        conv_kernel inputs where the state ships K-1: the oldest one, which no later output reads,
        stands as a zero."""
        kernel = self._conv_shape[0] + 1
        for i, li in enumerate(self.ssm_layers):
            conv = pad(torch.tensor(state.conv[i]).T, (1, 0)).to(self.device)
            cache.update_conv_state(conv[None], li, conv_kernel_size=kernel)
            cache.update_recurrent_state(torch.tensor(state.ssm[i])[None].to(self.device), li)

    def _snapshot(self, cache: DynamicCache) -> SsmState:
        """The cache's state as shipped (host memory, read only)."""
        return self._frozen_state([self._layer_state(cache, li) for li in self.ssm_layers])

    @staticmethod
    def _layer_state(cache: DynamicCache, li: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `li`'s (conv K-1 inputs [K-1, conv_dim], recurrent state), copied as they are now."""
        conv, ssm = cache.get_conv_state(li), cache.get_recurrent_state(li)
        assert conv is not None and ssm is not None, f"layer {li}: the step left no state"
        return conv[0, :, 1:].T.clone(), ssm[0].clone()

    def _frozen_state(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> SsmState:
        convs, ssms = [c for c, _ in layers], [s for _, s in layers]
        return _frozen(
            SsmState(
                _stack(convs, self._conv_shape).cpu().numpy(), _stack(ssms, self._ssm_shape).cpu().numpy()
            )
        )

    def read_state(self, block: int) -> SsmState:
        """The state saved to `block` (what a handoff sends; read only)."""
        state = self._saved.get(block)
        if state is None:
            raise LookupError(f"state block {block} holds no saved SSM state")
        return state

    def write_state(self, block: int, state: SsmState) -> None:
        """Store a received state into `block` (copied: it may be a read-only view into Ray's store)."""
        conv, ssm = np.array(state.conv, np.float32), np.array(state.ssm, np.float32)
        layers = len(self.ssm_layers)
        if conv.shape != (layers, *self._conv_shape) or ssm.shape != (layers, *self._ssm_shape):
            raise ValueError(
                f"an SSM state of shapes {conv.shape} and {ssm.shape}; this model's are "
                f"{(layers, *self._conv_shape)} and {(layers, *self._ssm_shape)}"
            )
        self._saved[block] = _frozen(SsmState(conv, ssm))

    def release(self, request_id: str) -> None:
        """Drop a request's working KV and state; its pool slots and saved states stay."""
        super().release(request_id)
        self._states.pop(request_id, None)

    def assert_empty(self) -> None:
        super().assert_empty()
        assert not self._states, f"runner still holds the working SSM state of {list(self._states)}"


def _stack(tensors: list[torch.Tensor], shape: tuple[int, ...]) -> torch.Tensor:
    """The layers' tensors stacked (none: a model without Mamba2 layers ships empty arrays)."""
    return torch.stack(tensors) if tensors else torch.zeros(0, *shape)


def _frozen(state: SsmState) -> SsmState:
    state.conv.flags.writeable = False
    state.ssm.flags.writeable = False
    return state
