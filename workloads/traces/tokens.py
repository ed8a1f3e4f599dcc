"""Token synthesis that keeps a trace's sharing: hash IDs -> token IDs, deterministically.

Each hash ID becomes one block of `trace_block_size` token IDs drawn from a counter-based generator
keyed by (seed, namespace, ID), so equal IDs in one namespace are equal tokens and nothing else is
(IDs local to a file get the file as namespace: two files never share by accident). The engine
hashes the tokens at its own `block_size`, so trace and engine block sizes are independent::

    hash_ids   [  7  ][  8  ][  9  ]          trace blocks (512 tokens: Mooncake; 64: WEKA)
    tokens     |.......|.......|...|          the last block cut to num_tokens
    engine     |..|..|..|..|..|..|.|          re-hashed every block_size (16) tokens, chained

Token IDs are drawn from the runner's vocabulary, so the real-compute runner can run them too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import xxhash

from messages.token_ids import PromptIds, TokenIds, TraceBlocks
from workloads.traces.session import ChatPrompt, HashPrompt, Prompt, TokenPrompt


class TokenSynthesizer:
    def __init__(
        self,
        vocab_size: int,
        block_size: int | None,
        seed: int = 0,
        render_chat: Callable[[list[dict[str, Any]]], list[int]] | None = None,
    ) -> None:
        """`block_size`: tokens per hash ID of the trace (None: it has no hash IDs); `render_chat`: the
        render tier's template and tokenizer, for chat prompts (full-text traces)."""
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.seed = seed
        self.render_chat = render_chat
        self._made: dict[tuple[int, str], tuple[Prompt, PromptIds]] = {}
        """Recent prompts' tokens by (object id, salt), with the prompt (so an id is never mistaken for
        a later object's): a session asks for a turn's prompt twice, as the turn before's next prompt
        and then as its own; it is made (drawn, rendered) once."""
        self._blocks: dict[str, dict[int, np.ndarray]] = {}
        """namespace -> hash ID -> its tokens."""
        self._nodes: dict[tuple[str | int, int], int] = {}
        """(namespace or the node before, hash ID) -> the node naming that chain of hash IDs."""
        self._hash_memo: dict[tuple[int, int], list[bytes]] = {}
        """Every prompt's `TraceBlocks.memo`: block hashes by (node, block size)."""

    def blocks(self, namespace: str, hash_ids: Sequence[int]) -> list[np.ndarray]:
        """The tokens of each hash ID (cached: a trace's shared blocks are drawn once; the new ones at
        once)."""
        assert self.block_size is not None
        blocks = self._blocks.setdefault(namespace, {})
        missing = [h for h in dict.fromkeys(hash_ids) if h not in blocks]
        if missing:
            keys = [xxhash.xxh3_64_intdigest(f"{self.seed}/{namespace}/{h}".encode()) for h in missing]
            drawn = _counter_tokens(np.array(keys, dtype=np.uint64), self.block_size, self.vocab_size)
            blocks.update(zip(missing, drawn, strict=True))
        return list(map(blocks.__getitem__, hash_ids))

    def tokens(self, prompt: Prompt, salt: str = "") -> PromptIds:
        """A prompt's token IDs: hash IDs drawn as blocks, token IDs as they are, chat messages rendered.
        `salt` extends a hash-ID prompt's namespace: a replayed user's private blocks."""
        key = (id(prompt), salt)
        made = self._made.pop(key, None)  # its second ask: made for the turn before
        if made is not None and made[0] is prompt:
            return made[1]
        tokens = self._make(prompt, salt)
        self._made[key] = (prompt, tokens)
        while len(self._made) > 256:  # the second ask comes right after the first
            del self._made[next(iter(self._made))]
        return tokens

    def _make(self, prompt: Prompt, salt: str) -> PromptIds:
        if isinstance(prompt, TokenPrompt):
            return list(prompt.token_ids)
        if isinstance(prompt, ChatPrompt):
            assert self.render_chat is not None, "a chat trace needs the render tier (render_chat)"
            return self.render_chat(list(prompt.messages))
        assert isinstance(prompt, HashPrompt), "a follow-up's history is the session's, not the trace's"
        namespace = prompt.namespace + salt
        blocks = self.blocks(namespace, prompt.hash_ids)
        if not blocks:
            return []
        assert self.block_size is not None  # (a trace with hash IDs has one)
        trace = TraceBlocks(self.block_size, self._chain(namespace, prompt.hash_ids), self._hash_memo)
        return TokenIds(np.concatenate(blocks)[: prompt.num_tokens], trace)

    def _chain(self, namespace: str, hash_ids: Sequence[int]) -> list[int]:
        """The node of each prefix of `hash_ids` (`TraceBlocks.nodes`)."""
        nodes, chain = self._nodes, []
        before: str | int = namespace
        for h in hash_ids:
            node = nodes.setdefault((before, h), len(nodes))
            chain.append(node)
            before = node
        return chain

    def answer(
        self,
        prompt: PromptIds,
        next_prompt: PromptIds | None,
        max_tokens: int,
        salt: str,
    ) -> list[int]:
        """The forced answer of a turn: where the session's next prompt continues this one, the tokens
        it continues with (so an engine that kept the answer's KV hits on the next turn); the rest
        drawn from `salt` (the request's own)."""
        n = len(prompt)
        reused = (
            next_prompt[n : n + max_tokens]
            if next_prompt is not None and _starts_with(next_prompt, prompt)
            else []
        )
        if len(reused) == max_tokens:
            return reused
        key = np.array([xxhash.xxh3_64_intdigest(f"{self.seed}/answer/{salt}".encode())], dtype=np.uint64)
        return reused + _counter_tokens(key, max_tokens - len(reused), self.vocab_size)[0].tolist()


def _starts_with(tokens: PromptIds, prefix: PromptIds) -> bool:
    """`tokens[:len(prefix)] == prefix`."""
    if isinstance(tokens, TokenIds) and isinstance(prefix, TokenIds):  # drawn here: as arrays
        return tokens.startswith(prefix)
    return tokens[: len(prefix)] == prefix


def _counter_tokens(keys: np.ndarray, block_size: int, vocab_size: int) -> np.ndarray:
    """`block_size` token IDs below `vocab_size` for each of `keys` (uint64), a row each: SplitMix64
    over the counter key + position (its output passes BigCrush from a counter), scaled into the
    vocabulary by its high 32 bits. Written out because numpy's generators cost a seeding each
    (~27 us a block, seconds on a trace's tens of thousands of blocks); this is arrays throughout."""
    x = keys[:, None] + _golden_steps(block_size)[None, :]
    for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):  # in place: no copies
        x ^= x >> np.uint64(shift)
        x *= np.uint64(mul)
    x ^= x >> np.uint64(31)
    x >>= np.uint64(32)
    x *= np.uint64(vocab_size)
    x >>= np.uint64(32)
    return x.astype(np.int32)


@functools.lru_cache(maxsize=8)
def _golden_steps(n: int) -> np.ndarray:
    """SplitMix64's counter increments for positions 1..n."""
    return np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
