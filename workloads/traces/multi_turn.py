"""Synthetic multi-turn conversations in the shape of vLLM's `benchmarks/multi_turn` generator.

Every conversation opens with a prefix shared by all of them (a system prompt), then one of its own
(first turn only), then the user's message; each later turn appends the previous answer and a new
user message, so the whole history is the next prompt::

    turn 1   [common][own prefix][user 1]
    turn 2   [common][own prefix][user 1][answer 1][user 2]
    turn k   ... [answer k-1][user k]

Lengths come from named distributions (`dist` strings, parsed by `parse_dist`): `constant:N`,
`uniform:LO:HI`, `lognormal:MEAN:SIGMA`, `zipf:A`, `poisson:MEAN`, each optionally `...:max=M`.
Conversations start as a Poisson process of `conversation_rate`; a turn follows the previous answer
after `think_s`. Answers are forced to the tokens the next prompt repeats, so an engine that kept a
conversation's KV hits on all of it. Deterministic for a seed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from emulation.config import MultiTurnConfig
from workloads.traces.session import FollowUp, Prompt, Session, TokenPrompt, Trace, Turn

DIST_KINDS = ("constant", "uniform", "lognormal", "zipf", "poisson")


def parse_dist(text: str) -> Callable[[np.random.Generator], float]:
    """A sampler for `text`; ValueError naming what is allowed."""
    parts = text.split(":")
    cap = float("inf")
    if parts and parts[-1].startswith("max="):
        cap = float(parts.pop()[4:])
    kind, args = parts[0], [float(a) for a in parts[1:]]
    arity = {"constant": 1, "uniform": 2, "lognormal": 2, "zipf": 1, "poisson": 1}
    if kind not in arity or len(args) != arity[kind]:
        allowed = "constant:N, uniform:LO:HI, lognormal:MEAN:SIGMA, zipf:A, poisson:MEAN (each [:max=M])"
        raise ValueError(f"{text!r}: expected one of {allowed}")
    draw: Callable[[np.random.Generator], float] = {
        "constant": lambda rng: args[0],
        "uniform": lambda rng: rng.uniform(args[0], args[1]),
        "lognormal": lambda rng: rng.lognormal(np.log(args[0]) - args[1] ** 2 / 2, args[1]),
        "zipf": lambda rng: float(rng.zipf(args[0])),
        "poisson": lambda rng: float(rng.poisson(args[0])),
    }[kind]
    return lambda rng: min(draw(rng), cap)


def multi_turn_trace(cfg: MultiTurnConfig, vocab_size: int, seed: int) -> Trace:
    rng = np.random.default_rng([seed, 7])
    turns_of, own_of = parse_dist(cfg.num_turns), parse_dist(cfg.prefix_tokens)
    user_of, answer_of, think_of = (
        parse_dist(cfg.user_tokens),
        parse_dist(cfg.output_tokens),
        parse_dist(cfg.think_s),
    )

    def tokens(n: float, minimum: int = 1) -> list[int]:
        return rng.integers(0, vocab_size, max(minimum, round(n))).tolist()

    common = rng.integers(0, vocab_size, cfg.common_prefix_tokens).tolist()
    start_s = 0.0
    sessions = []
    for c in range(cfg.num_conversations):
        history = common + tokens(own_of(rng), minimum=0)
        num_seen = len(history)  # history=model: its length with each answer stripped
        turns = []
        t_s = start_s
        for k in range(max(1, round(turns_of(rng)))):
            think_s = think_of(rng) if k else 0.0
            user = tokens(user_of(rng))
            answer = tokens(answer_of(rng))
            if cfg.history == "model" and k:  # the model's own answers make the history, when sent
                edits = (cfg.strip_answer_tokens, cfg.rewrite_answer_tokens)
                prompt: Prompt = FollowUp(tuple(user), *edits, num_history_tokens=num_seen)
            else:
                prompt = TokenPrompt(tuple(history + user))
            turns.append(Turn(prompt, len(answer), t_s, think_s=think_s))
            history = history + user + answer
            num_seen += len(user) + len(answer) - min(cfg.strip_answer_tokens, len(answer))
            t_s += think_s
        sessions.append(Session(f"conv-{c:04d}", turns))
        start_s += rng.exponential(1.0 / cfg.conversation_rate)
    return Trace("multi_turn", sessions)
