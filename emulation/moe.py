"""Mixture-of-experts layers: their geometry, and which experts a step's tokens reach.

A MoE layer replaces the dense MLP with `num_experts` routed experts (each a small gated MLP of
`moe_intermediate_size`), of which every token uses `num_experts_per_tok` (top-k), plus shared
experts every token uses. A step's routed work is therefore set by how its tokens spread:

    FLOPs      = 2 · expert params · assignments          assignments = tokens · top_k
    weight B   = expert bytes · experts touched            (an expert no token picked is not read)

Each token picks expert e with probability π_e (Σ π_e = top_k; uniform: top_k / E). Tokens route
independently, so after T tokens::

    P(e untouched) = (1 - π_e)^T        experts touched = Σ_e 1 - (1 - π_e)^T
    DeepSeek-V3 (E 256, k 8, uniform):  T=1: 8   T=8: 57.4   T=64: 222.4   T=1,024: 256.0

Expert parallelism shards the experts over `ep` ranks (contiguous blocks of E / ep; with redundant
copies, EPLB's replication and balanced packing: `ExpertPlacement`). Every rank waits for
the slowest at the next layer, so the step pays for the busiest rank: its expected assignments plus
the spread of a sum of independent choices, max over ep ranks ≈ mean + σ·sqrt(2 ln ep) (a normal
approximation, capped at what the rank can receive). Its imbalance is that over the mean rank's.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class MoeGeometry:
    """A model's MoE sizes, Hugging Face config names where they exist."""

    num_experts: int
    """Routed experts per MoE layer (n_routed_experts, num_experts, num_local_experts)."""
    num_experts_per_tok: int
    """Experts each token is routed to (top-k)."""
    moe_intermediate_size: int
    """One routed expert's MLP width."""
    shared_expert_intermediate_size: int = 0
    """The shared experts' MLP width, together (DeepSeek-V3: 1 x 2,048; 0: none)."""
    num_dense_layers: int = 0
    """Leading layers with a dense MLP of the model's intermediate_size (first_k_dense_replace)."""
    num_projections: int = 3
    """Weight matrices of an expert: 3 gated (gate, up, down: SwiGLU), 2 for Nemotron-H's squared-ReLU
    experts (up, down)."""

    def expert_params(self, hidden_size: int) -> int:
        """One routed expert's projections."""
        return self.num_projections * hidden_size * self.moe_intermediate_size

    def shared_params(self, hidden_size: int) -> int:
        """One layer's shared experts and router (every token runs through both)."""
        shared = self.num_projections * hidden_size * self.shared_expert_intermediate_size
        return shared + hidden_size * self.num_experts


def expert_popularity(skew: str, num_experts: int, zipf_s: float = 1.0, loads_file: str | None = None,
                      seed: int = 0) -> np.ndarray:  # fmt: skip
    """Each expert's share of the routing (sums to 1). zipf: rank r's share ∝ (r + 1)^-s, the ranks
    dealt to experts by a seeded permutation; file: the loads read from `loads_file`.

    Raises ValueError naming what is wrong with the file (the config edge words it)."""
    if skew == "uniform":
        return np.full(num_experts, 1.0 / num_experts)
    if skew == "zipf":
        shares = (np.arange(num_experts) + 1.0) ** -zipf_s
        shares = shares[np.random.default_rng(seed).permutation(num_experts)]
        return shares / shares.sum()
    loads = _read_loads(Path(str(loads_file)))
    if len(loads) != num_experts or (loads < 0).any() or loads.sum() <= 0:
        raise ValueError(
            f"{len(loads)} loads; allowed: {num_experts} non-negative numbers (one per routed expert), "
            "not all zero"
        )
    return loads / loads.sum()


def _read_loads(path: Path) -> np.ndarray:
    text = path.read_text()
    try:
        try:
            values = json.loads(text)
        except ValueError:
            values = [float(v) for v in text.split()]
        return np.asarray(values, dtype=float).ravel()
    except (TypeError, ValueError):
        raise ValueError(
            "not numbers; allowed: a JSON list of per-expert loads, or one number per line"
        ) from None


def inclusion(popularity: np.ndarray, top_k: int) -> np.ndarray:
    """π_e: the chance a token picks expert e, Σ π_e = top_k, none above 1 (an expert hotter than
    1/top_k is picked by every token and the rest share what is left)."""
    pi = popularity * top_k
    for _ in range(top_k):
        over = pi > 1.0
        if not over.any():
            break
        rest = ~over
        pi = np.where(over, 1.0, pi * (top_k - over.sum()) / pi[rest].sum())
    return np.minimum(pi, 1.0)


@dataclass(frozen=True)
class ExpertLoad:
    """What a step of `num_tokens` tokens asks of the experts, in expectation."""

    num_tokens: int
    mean_tokens_per_expert: float
    """tokens · top_k / experts (48 DP ranks x 32 decodes on DeepSeek-V3: 48)."""
    max_tokens_per_expert: float
    """The busiest expert's tokens (its expectation plus the spread over all experts)."""
    experts_touched: float
    """Distinct routed experts at least one token picked (over all ranks)."""
    rank_tokens: float
    """Tokens the busiest EP rank's experts compute (assignments: a token counts once per expert)."""
    rank_experts_touched: float
    """Of the busiest rank's expert copies, those some token picked (their weights are read)."""
    imbalance: float
    """rank_tokens over the mean rank's (1: balanced)."""


class ExpertPlacement:
    """Experts over `ep` ranks. Without redundant experts, contiguous blocks of E / ep (a static
    placement). With them, as DeepSeek's EPLB places them: replicate, `num_redundant` times, the expert
    with the most tokens per copy; then deal every copy, heaviest first, to the least loaded rank that
    has a free slot ((E + num_redundant) / ep a rank) and no copy of it. Each copy takes an equal share
    of its expert's tokens."""

    def __init__(self, popularity: np.ndarray, top_k: int, ep: int, num_redundant: int = 0) -> None:
        num_experts = len(popularity)
        self.top_k, self.ep, self.num_experts = top_k, ep, num_experts
        self.pi = inclusion(popularity, top_k)
        if num_redundant:
            ranks_of = self._balanced(ep, num_redundant)
        else:
            ranks_of = [[e * ep // num_experts] for e in range(num_experts)]  # E/ep a rank
        self._rank = np.array([r for held in ranks_of for r in held])
        self._pi_copy = np.array([self.pi[e] / len(held) for e, held in enumerate(ranks_of) for _ in held])
        """π of each copy: its expert's, split over the copies."""

    def _balanced(self, ep: int, num_redundant: int) -> list[list[int]]:
        """Each expert's ranks under EPLB's replication and balanced packing (the class docstring)."""
        num_experts = len(self.pi)
        copies = np.ones(num_experts)
        for _ in range(num_redundant):
            copies[np.argmax(self.pi / copies)] += 1
        slots = -(-(num_experts + num_redundant) // ep)
        load, count = np.zeros(ep), np.zeros(ep)
        ranks_of: list[list[int]] = [[] for _ in range(num_experts)]
        physical = [e for e in range(num_experts) for _ in range(int(copies[e]))]
        for e in sorted(physical, key=lambda e: -self.pi[e] / copies[e]):  # stable: ties by expert
            barred = (count >= slots) | np.isin(np.arange(ep), ranks_of[e])
            r = int(np.argmin(np.where(barred, np.inf, load)))
            load[r] += self.pi[e] / copies[e]
            count[r] += 1
            ranks_of[e].append(r)
        return ranks_of

    @lru_cache(maxsize=4096)  # noqa: B019 (one placement per engine, a few thousand token counts)
    def load(self, num_tokens: int) -> ExpertLoad:
        t, pi, ep = num_tokens, self._pi_copy, self.ep
        mean_rank = t * self.top_k / ep
        rank_mean = np.bincount(self._rank, weights=t * pi, minlength=ep)
        rank_var = np.bincount(self._rank, weights=t * pi * (1 - pi), minlength=ep)
        z_rank = math.sqrt(2 * math.log(ep)) if ep > 1 else 0.0
        cap = t * np.minimum(self.top_k, np.bincount(self._rank, minlength=ep))
        rank_tokens = np.minimum(rank_mean + z_rank * np.sqrt(rank_var), cap)
        busiest = int(np.argmax(rank_tokens))
        untouched = (1.0 - pi) ** t
        z_expert = math.sqrt(2 * math.log(len(pi))) if len(pi) > 1 else 0.0
        per_expert = t * pi + z_expert * np.sqrt(t * pi * (1 - pi))
        return ExpertLoad(
            num_tokens=t,
            mean_tokens_per_expert=t * self.top_k / self.num_experts,
            max_tokens_per_expert=float(min(per_expert.max(), t)),
            experts_touched=float(np.sum(1.0 - (1.0 - self.pi) ** t)),
            rank_tokens=float(rank_tokens[busiest]),
            rank_experts_touched=float(np.sum((1.0 - untouched)[self._rank == busiest])),
            imbalance=float(rank_tokens[busiest] / mean_rank) if t else 1.0,
        )
