"""A mixture-of-experts target's steps as an engine records them: each step's expert load, expert-
parallel communication and, under attention-FFN disaggregation, the cut's transfers and the pipeline's
bubbles (`MoeWork`, carried by `stats.StepWork`: what the recorder's `testbed:moe_*`
series observe), and the engine's log of them over emulated time for the run's report (`MoeStepLog`,
whose `MoeSteps` its `EngineReport` carries into engines.json).

The log takes each step's end from its tokens: the engine stamps a step's tokens with the step's end,
so a step that emitted any ended at their stamp; one that emitted none (prompt chunks short of their
prompt's end) ended where the next step started, since its requests still had work::

    end of a step without tokens = the next step's end - the next step's time

Steps one at a time and windows of them (`actors.engine.window.plan`) stamp the same ends and time the same
steps, so they log the same points, bit for bit.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import numpy as np

from emulation.afd_layout import AfdStepTime

if TYPE_CHECKING:
    from emulation.time_model import TimedStep

MOE_LOG_POINTS = 1024
"""The most points an engine's MoE step log keeps: plenty for a plot's width, and little for
engines.json (or an actor's report) however long the run."""


def per_step(value: float, num_steps: int) -> list[float]:
    """`value` as one float a step: an array's elements, or the value repeated."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return value.astype(np.float64).tolist()  # type: ignore[no-any-return]  # floats
    return [float(value)] * num_steps


@dataclass(frozen=True)
class MoeWork:
    """MoE steps' expert load (`emulation.moe.ExpertLoad`'s expectations) and all-to-alls, as the time
    model gives them: one value a step, in the steps' order."""

    num_tokens: Sequence[float] = ()
    """The step's tokens, all data-parallel attention ranks' together."""
    max_tokens_per_expert: Sequence[float] = ()
    mean_tokens_per_expert: Sequence[float] = ()
    """tokens x top_k / routed experts (AFD: of one FFN rank's micro-batch, what its GEMMs see)."""
    imbalance: Sequence[float] = ()
    """The busiest EP rank's token-expert assignments over the mean rank's (1: balanced)."""
    all_to_all_s: Sequence[float] = ()
    """Of the step's time (before overlap), the MoE layers' dispatches and combines (0 without
    data-parallel attention)."""
    overlap_s: Sequence[float] = ()
    """What dual-batch overlap hid of the step's time (0 without `enable_dbo`)."""
    a2f_bytes: Sequence[float] = ()
    f2a_bytes: Sequence[float] = ()
    """AFD (0 without): what the attention ranks sent to the FFN ranks, and got back, in the step."""
    afd_exposed_s: Sequence[float] = ()
    """AFD: what those transfers added to the step (the pipeline less the same with no link)."""
    attention_bubble_s: Sequence[float] = ()
    ffn_bubble_s: Sequence[float] = ()
    """AFD: each side's idle time inside the pipeline (waiting on the other, or on the link)."""
    ffn_utilization: Sequence[float] = ()
    """AFD: the share of the step the FFN rank computed (its busy time over the step's)."""

    @classmethod
    def of(cls, step: TimedStep, num_steps: int = 1) -> MoeWork | None:
        """Of `num_steps` steps timed at once (decodes only: one expert load, the times arrays or one
        value every step shares), or of one step; None for a dense target's."""
        load = step.expert_load
        if load is None:
            return None
        afd = _afd_figures(step) if isinstance(step, AfdStepTime) else (0.0,) * 6
        tokens = step.num_tokens if isinstance(step, AfdStepTime) else load.num_tokens
        return cls(
            per_step(tokens, num_steps),
            per_step(load.max_tokens_per_expert, num_steps),
            per_step(load.mean_tokens_per_expert, num_steps),
            per_step(load.imbalance, num_steps),
            per_step(step.all_to_all_s, num_steps),
            per_step(step.overlap_s, num_steps),
            *(per_step(v, num_steps) for v in afd),
        )

    @classmethod
    def of_each(cls, steps: Sequence[TimedStep]) -> MoeWork | None:
        """Of steps timed one at a time; None for a dense target's."""
        each = [cls.of(s) for s in steps]
        if not each or any(w is None for w in each):
            return None
        return cls(
            *(list(itertools.chain.from_iterable(getattr(w, f.name) for w in each)) for f in fields(cls))
        )

    def first(self, num_steps: int) -> MoeWork:
        return MoeWork(*(getattr(self, f.name)[:num_steps] for f in fields(self)))

    def rows(self) -> Iterator[tuple[float, ...]]:
        """Each step's figures, in the fields' order."""
        return zip(*(getattr(self, f.name) for f in fields(self)), strict=True)


@dataclass(frozen=True)
class MoeSteps:
    """An engine's MoE steps over emulated time (engines.json, the report's MoE plot): a point a step
    while they fit in `MOE_LOG_POINTS`, then a point a run of consecutive steps (adjacent points merge
    pairwise as the log fills: every point but the last covers as many steps), its figures their means
    over those steps."""

    end_s: list[float]
    """When the point's last step ended."""
    num_steps: list[int]
    num_tokens: list[float]
    max_tokens_per_expert: list[float]
    mean_tokens_per_expert: list[float]
    imbalance: list[float]
    all_to_all_s: list[float]
    overlap_s: list[float]
    a2f_bytes: list[float]
    f2a_bytes: list[float]
    afd_exposed_s: list[float]
    attention_bubble_s: list[float]
    ffn_bubble_s: list[float]
    ffn_utilization: list[float]


_NUM_FIGURES = len(fields(MoeWork))


def _afd_figures(step: AfdStepTime) -> tuple[float, ...]:
    """An AFD step's figures, in `MoeWork`'s order."""
    p = step.pipeline
    return (
        step.a2f_bytes,
        step.f2a_bytes,
        p.communication_s,
        p.attention_bubble_s,
        p.ffn_bubble_s,
        p.ffn_s / step.total_s,
    )


class MoeStepLog:
    """The engine's MoE steps as they end (see the module's docstring): points of
    [end, steps, the sums of their `MoeWork` figures]."""

    def __init__(self, max_points: int = MOE_LOG_POINTS) -> None:
        assert max_points >= 2 and max_points % 2 == 0, "points merge pairwise"
        self.max_points = max_points
        self.num_steps = 0
        self._points: list[list[float]] = []
        self._partial: list[float] | None = None
        """The point under way (fewer steps than `_stride`)."""
        self._stride = 1
        """Steps a point covers."""
        self._pending: list[tuple[float, tuple[float, ...]]] = []
        """(time, figures) of the steps whose end is not known yet: no token since."""
        self._last_end_s = 0.0

    def add(self, step_s: Sequence[float], ends_s: Sequence[float], moe: MoeWork) -> None:
        """Steps that took `step_s` (seconds, each) with figures `moe`; the last len(`ends_s`) of them
        ended at `ends_s` (their tokens' stamps), the others emitted nothing."""
        self.num_steps += len(step_s)
        self._pending += zip(step_s, moe.rows(), strict=True)
        if not ends_s:
            return
        steps, self._pending = self._pending, []
        num_unstamped = len(steps) - len(ends_s)
        ends = [0.0] * num_unstamped + list(ends_s)
        for j in range(num_unstamped - 1, -1, -1):  # each ended where the next one started
            ends[j] = ends[j + 1] - steps[j + 1][0]
        for end, (_, figures) in zip(ends, steps, strict=True):
            self._point(end, figures)

    def _point(self, end_s: float, figures: tuple[float, ...]) -> None:
        p = self._partial
        if p is None:
            p = self._partial = [end_s, 0, *[0.0] * _NUM_FIGURES]
        p[0] = self._last_end_s = end_s
        p[1] += 1
        for i, v in enumerate(figures, 2):
            p[i] += v
        if p[1] < self._stride:
            return
        self._points.append(p)
        self._partial = None
        if len(self._points) == self.max_points:  # full: every two points become one
            pairs = zip(self._points[::2], self._points[1::2], strict=True)
            self._points = [[b[0], *(x + y for x, y in zip(a[1:], b[1:], strict=True))] for a, b in pairs]
            self._stride *= 2

    def snapshot(self) -> MoeSteps:
        """The log so far; steps whose end is not known yet end one after another from the last known."""
        log = copy.copy(self)  # points once appended never change: only the list and the partial one
        log._points, log._pending = list(self._points), []
        log._partial = None if self._partial is None else list(self._partial)
        end = log._last_end_s
        for s, figures in self._pending:
            end += s
            log._point(end, figures)
        points = log._points + ([log._partial] if log._partial is not None else [])
        columns = [list(c) for c in zip(*points, strict=True)] or [[] for _ in range(2 + _NUM_FIGURES)]
        end_s, num_steps, *sums = columns
        means = ([total / n for total, n in zip(col, num_steps, strict=True)] for col in sums)
        return MoeSteps(end_s, [int(n) for n in num_steps], *means)
