"""Choosing an engine among a pool's replicas: round robin, session affinity, or on KV (llm-d, Dynamo).

`kv_aware` and `kv_estimated` score every engine with Dynamo's cost::

    cost = overlap_weight x blocks it would prefill + its active blocks
         = overlap_weight x (prompt blocks - leading blocks it holds) + blocks of requests routed there
                                                                       and not finished

where a leading block held only in an engine's offload tier (host, disk) counts `offload_hit_weight`
(llm-d's precise prefix scorer: GPU 1, CPU 0.8), not 1.

and the lowest wins (ties: the fewest active blocks, then round robin). `kv_aware` knows what each
engine holds from the engines' KV events (block hashes stored and removed, piggybacked on their output
batches: never a message per block); `kv_estimated` assumes a routed prompt's blocks stay cached on its
engine for `estimate_ttl_s` (llm-d's estimated prefix scorer, Dynamo's ApproxKvIndexer). Both hash the
prompt the engines' way (`block_hash`), so hashes compare across actors.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np

from actors.engine.health import EngineDeadError
from actors.engine.kv_cache.block_hash import ROOT_BLOCK_HASH, BlockHash, prompt_block_hashes
from emulation.config import RouterConfig
from emulation.kv_cache import cdiv
from messages import BlockStored, ClientRequest, KVEvents


class Router:
    """One pool's router (the proxy keeps one per pool it routes). Engines are named by index."""

    def __init__(
        self,
        num_engines: int,
        *,
        cfg: RouterConfig,
        block_size: int,
        now: Callable[[], float],
        policy: str | None = None,
        seed: int = 0,
        on_routed: Callable[[int, int, int], None] | None = None,
    ) -> None:
        """`policy` overrides `cfg.policy`; `least_loaded` (decode in P/D under a KV policy) picks the
        fewest active blocks. `now`: the run's clock, for the estimate's TTL. `on_routed(engine,
        overlap_blocks, prompt_blocks)` hears of every decision."""
        self.on_routed = on_routed
        self.cfg = cfg
        self.policy = policy or cfg.policy
        self.block_size = block_size
        self.now = now
        self._rng = np.random.default_rng(seed)
        self.num_engines = num_engines
        self.forget()
        self.num_routed = 0
        self.before_read: list[Callable[[], None]] = []
        """Called before `kv_aware` reads what engines hold: in process, each brings an engine's KV
        events up to now (its steps may run ahead of the events they handed over)."""

    def forget(self) -> None:
        """Start over knowing nothing (at construction, and as a restarted proxy's router)."""
        n = self.num_engines
        self._next = itertools.cycle(range(n))
        self._sessions: dict[str, int] = {}
        self._active_blocks = [0] * n
        self._inflight: dict[str, tuple[int, int]] = {}
        """request id -> (engine, its blocks)"""
        self._held: list[set[BlockHash]] = [set() for _ in range(n)]
        """What each engine holds in its GPU prefix cache, by its KV events (`kv_aware`)."""
        self._offloaded: list[dict[str, set[BlockHash]]] = [{} for _ in range(n)]
        """What each engine holds in each of its offload tiers, by medium (`kv_aware`)."""
        self._estimated: list[dict[BlockHash, float]] = [{} for _ in range(n)]
        """What each engine is assumed to hold: hash -> when the entry expires (`kv_estimated`)."""
        self.excluded: dict[int, str] = {}
        """Engines not picked, with why: dead ones (a call failed as a dead actor's does) for good,
        unresponsive ones (`router.prefill_timeout_s`) until they answer again."""

    def pick(self, creq: ClientRequest, engine: int | None = None) -> int:
        """The engine for `creq` (or `engine`, where the caller must send it: a conversation's decode
        engine holds its blocks); call `finished` when it ends."""
        hashes: list[BlockHash] = []
        overlaps = [0] * len(self._active_blocks)
        scores: Sequence[float] = overlaps
        if self.policy == "kv_estimated":
            tokens = creq.prompt_token_ids
            hashes = prompt_block_hashes(
                tokens, self.block_size, 0, len(tokens) // self.block_size, mm_items=creq.mm_items
            )
            overlaps = [self._overlap(i, hashes) for i in range(len(overlaps))]
            scores = overlaps
        elif self.policy == "kv_aware":
            for catch_up in self.before_read:
                catch_up()
            overlaps, scores = self._overlaps(creq)
        if len(self.excluded) == len(self._active_blocks):
            why = "; ".join(self.excluded.values())
            raise EngineDeadError(f"every engine of the pool is dead or unresponsive; {why}")
        if engine is None or engine in self.excluded:
            engine = self._choose(creq, scores)
        blocks = cdiv(len(creq.prompt_token_ids) + creq.max_tokens, self.block_size)
        self._active_blocks[engine] += blocks
        self._inflight[creq.request_id] = (engine, blocks)
        if self.policy == "kv_estimated":
            self._remember(engine, hashes)
        self.num_routed += 1
        if self.on_routed is not None:
            self.on_routed(engine, overlaps[engine], cdiv(len(creq.prompt_token_ids), self.block_size))
        return engine

    def _choose(self, creq: ClientRequest, scores: Sequence[float]) -> int:
        if self.policy in ("kv_aware", "kv_estimated"):
            return self._lowest_cost(creq, scores, self.cfg.overlap_weight)
        if self.policy == "least_loaded":
            return self._lowest_cost(creq, scores, 0.0)
        if self.policy == "session_affinity" and creq.session_id is not None:
            engine = self._sessions.get(creq.session_id)
            if engine is None or engine in self.excluded:
                engines = [i for i in range(len(self._active_blocks)) if i not in self.excluded]
                engine = self._sessions[creq.session_id] = min(engines, key=self._active_blocks.__getitem__)
            return engine
        while (turn := next(self._next)) in self.excluded:
            pass
        return turn

    def _remember(self, engine: int, hashes: list[BlockHash]) -> None:
        """kv_estimated: a routed prompt's blocks count as cached on `engine` for the TTL."""
        now = self.now()
        self._estimated[engine].update(dict.fromkeys(hashes, now + self.cfg.estimate_ttl_s))
        if self.num_routed % 256 == 0:  # drop what expired, now and then (a long trace's worth)
            for held in self._estimated:
                for h in [h for h, expires in held.items() if expires <= now]:
                    del held[h]

    def finished(self, request_id: str) -> None:
        engine, blocks = self._inflight.pop(request_id, (0, 0))
        self._active_blocks[engine] -= blocks

    def on_kv_events(self, engine: int, events: KVEvents) -> None:
        """An engine's prefix cache changed (`kv_aware`): blocks it now holds, and blocks it evicted."""
        if self.policy != "kv_aware":  # (only engines a kv_aware router reads publish them)
            return
        for event in events.events:
            if event.medium == "gpu":
                held = self._held[engine]
            else:
                held = self._offloaded[engine].setdefault(event.medium, set())
            if isinstance(event, BlockStored):
                held.update(event.block_hashes)
            else:
                held.difference_update(event.block_hashes)

    def _overlaps(self, creq: ClientRequest) -> tuple[list[int], list[float]]:
        """Each engine's `_overlap` with the prompt and its `_score`, hashing the prompt's blocks only
        as far as some engine holds them (in growing runs: a long match takes few calls, a miss little)."""
        tokens, bs = creq.prompt_token_ids, self.block_size
        num_full = len(tokens) // bs
        hashes: list[BlockHash] = []
        overlaps, scores = [], []
        for engine in range(len(self._held)):
            while True:
                num = self._overlap(engine, hashes)
                if num < len(hashes) or len(hashes) == num_full:
                    break
                lo, hi = len(hashes), min(num_full, 2 * len(hashes) + 1)
                parent = hashes[-1] if hashes else ROOT_BLOCK_HASH
                hashes += prompt_block_hashes(tokens, bs, lo, hi, parent, creq.mm_items)
            overlaps.append(num)
            scores.append(self._score(engine, hashes[:num]))
        return overlaps, scores

    def _overlap(self, engine: int, hashes: Sequence[BlockHash]) -> int:
        """Leading blocks of the prompt `engine` holds, in any tier (chained hashes: a match covers all
        before it)."""
        if self.policy == "kv_aware":
            num = 0
            for held in (self._held[engine], *self._offloaded[engine].values()):
                # a run on the GPU, then on a tier... (a block in none ends it; runs alternate rarely)
                num += sum(1 for _ in itertools.takewhile(held.__contains__, hashes[num:]))
            if num < len(hashes) and self._offloaded[engine]:
                tiers = [self._held[engine], *self._offloaded[engine].values()]
                num += sum(1 for _ in itertools.takewhile(lambda h: any(h in t for t in tiers), hashes[num:]))
            return num
        estimated, now = self._estimated[engine], self.now()
        return sum(1 for _ in itertools.takewhile(lambda h: estimated.get(h, -math.inf) > now, hashes))

    def _score(self, engine: int, hashes: Sequence[BlockHash]) -> float:
        """What `engine`'s overlap `hashes` is worth: 1 a block in its GPU prefix cache, the offload hit
        weight a block only in an offload tier (llm-d: a block counts its best tier's weight)."""
        if not self._offloaded[engine]:
            return float(len(hashes))
        num_gpu = sum(map(self._held[engine].__contains__, hashes))
        return num_gpu + self.cfg.offload_hit_weight * (len(hashes) - num_gpu)

    def _lowest_cost(self, creq: ClientRequest, scores: Sequence[float], w: float) -> int:
        num_blocks = cdiv(len(creq.prompt_token_ids), self.block_size)
        alive = [i for i in range(len(scores)) if i not in self.excluded]  # (some: `pick` checked)
        costs = np.array([w * (num_blocks - scores[i]) + self._active_blocks[i] for i in alive])
        if self.cfg.temperature > 0 and costs.max() > costs.min():
            logits = -(costs - costs.min()) / (costs.max() - costs.min()) / self.cfg.temperature
            p = np.exp(logits - logits.max())
            return alive[int(self._rng.choice(len(costs), p=p / p.sum()))]
        best = [alive[i] for i in np.flatnonzero(costs == costs.min())]
        if len(best) == 1:
            return best[0]
        fewest = min(self._active_blocks[i] for i in best)
        ties = [i for i in best if self._active_blocks[i] == fewest]
        while (i := next(self._next)) not in ties:
            pass
        return i
