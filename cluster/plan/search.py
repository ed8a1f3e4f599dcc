"""Each candidate's goodput: the highest load of the grid at which it meets an SLO target.

    loads  l0 < l1 < ... < l(L-1)          (requests/s, or a trace's speedup)
    index  -1 |  0   1   2   3   4  |  L   (-1: meets none; L: never probed, above the grid)
               lo ^ met       hi ^ missed  ->  goodput index = lo once hi = lo + 1

Bisection assumes a design that meets a target at some load meets it at every lower one. Seeds are
halved as successive halving does: round k replays every survivor with the first 2^k seeds
(pooled: a target holds over all their requests together), starting from the goodput the round
before found (probe it, then gallop 1, 2, 4 loads away in the direction its outcome points, then
bisect), and keeps the better half (ties at the cut kept) until a round has used every seed. Inside
a round, branch and bound stops a candidate whose best possible score is under the keep-th best
already met (the last round keeps one: only the top needs its exact goodput). Candidates whose
latency floor alone misses the target are dropped before any replay (`floors`). `exhaustive`
replays every candidate at every load and seed instead: the reference the search is checked
against, its goodput the highest load up to which every load meets the target.

Every run is a fresh virtual replay (`run_virtual`, no metrics) in a worker process; runs are
cached by (candidate, load, seed), so the rounds and the targets share them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pandas as pd

from cluster.load import with_load
from cluster.plan.space import Candidate
from cluster.sweep import InterruptedRuns, run_in_processes
from cluster.virtual import run_virtual
from emulation.config import TestbedConfig
from messages.stats import EngineReport
from workloads.replay import LoadedWorkload, Workload, workload_for
from workloads.slo_targets import SloTarget

COLUMNS = ["ok", "ttft_s", "tpot_s", "e2el_s", "max_gap_s", "p99_itl_s", "token_times_s", "handoff_s"]
COLUMNS += ["num_output_tokens"]
"""What a run sends back of its results table: what the targets and the verdict read."""


@dataclass(frozen=True)
class Probe:
    """One replay of one candidate at one load and seed."""

    results: pd.DataFrame
    busy_share: dict[str, float]
    """Role -> its engines' mean share of the run's span spent in steps."""
    duration_s: float
    """Emulated seconds from the first arrival to the last token."""


_TRACES: dict[str, Workload] = {}
"""Traces by what decides them (a trace's speedup applies as it replays, the seed may sample it):
each is parsed once, in the search's process before its workers fork, not once per replay (~0.6 s of
a 3.5 s WEKA replay)."""


def _workload(cfg: TestbedConfig) -> LoadedWorkload | None:
    if cfg.workload.kind != "trace":
        return None  # synthetic arrivals and conversation starts depend on the load
    key = repr((replace(cfg.replay, speedup=1.0), cfg.seed, cfg.runner.vocab_size))
    if key not in _TRACES:
        _TRACES[key] = workload_for(cfg)
    return LoadedWorkload(_TRACES[key], {})  # the summary's trace keys: not read here


def run_probe(cfg: TestbedConfig) -> Probe:
    out = run_virtual(cfg, _workload(cfg), metrics=False)
    duration = float(out.summary["duration_s"] or 0.0)
    busy: dict[str, list[float]] = {}
    for report in out.engine_reports.values():
        if isinstance(report, EngineReport) and duration > 0:
            busy.setdefault(report.role, []).append(report.counters.busy_s / duration)
    shares = {role: sum(v) / len(v) for role, v in busy.items()}
    return Probe(out.results[COLUMNS].reset_index(drop=True), shares, duration)


BOUNDED = "bounded below the best"
"""`Outcome.dropped` of a candidate branch and bound stopped in the last round."""

Key = tuple[int, int, int]
"""(candidate index, load index, seed)."""


@dataclass
class Outcome:
    """What the search concluded of one candidate under one target."""

    goodput_index: int
    """-1: meets the target at no load of the grid."""
    seeds: tuple[int, ...]
    """The seeds the conclusion pools."""
    dropped: str | None = None
    """Why it left the search early (a floor, a halving round, branch and bound); None: it reached
    the last round with its goodput found."""
    goodput_under: float | None = None
    """Branch and bound stopped it with its bracket open below this load (None: open to the grid's
    top; its goodput is at least `goodput_index`'s load)."""


@dataclass
class Search:
    """The candidates, the load grid and the seeds, and every replay run so far: `ensure` runs the
    missing ones in parallel; the methods below decide which to ask for."""

    candidates: Sequence[Candidate]
    loads: Sequence[float]
    seeds: Sequence[int]
    jobs: int | None = None
    on_runs: Callable[[int], None] | None = None
    """Called with the number of runs about to start, before each batch."""
    runs: dict[Key, Probe] = field(default_factory=dict)

    # -- runs --------------------------------------------------------------------------------------

    def ensure(self, keys: Sequence[Key]) -> None:
        """Replay the keys not cached yet, in parallel."""
        missing = list(dict.fromkeys(k for k in keys if k not in self.runs))
        if not missing:
            return
        if self.on_runs:
            self.on_runs(len(missing))
        cfgs = [with_load(self.candidates[c].cfg, self.loads[li], s) for c, li, s in missing]
        for cfg in cfgs:
            _workload(cfg)  # traces parsed here, inherited by the forked workers
        try:
            probes = run_in_processes(run_probe, cfgs, self.jobs)
        except InterruptedRuns as e:  # Ctrl-C: those done are kept
            self.runs.update((missing[i], probe) for i, probe in e.done.items())
            raise
        self.runs.update(zip(missing, probes, strict=True))

    def pooled(self, c: int, li: int, seeds: Sequence[int]) -> pd.DataFrame:
        return pd.concat([self.runs[(c, li, s)].results for s in seeds], ignore_index=True)

    def probes(self, c: int, li: int, seeds: Sequence[int]) -> list[Probe] | None:
        """The replays of candidate `c` at load index `li` over `seeds`; None unless all were run."""
        if not seeds or li < 0 or any((c, li, s) not in self.runs for s in seeds):
            return None
        return [self.runs[(c, li, s)] for s in seeds]

    def meets(self, target: SloTarget, c: int, li: int, seeds: Sequence[int]) -> bool:
        return target.met(self.pooled(c, li, seeds))

    # -- the two methods ---------------------------------------------------------------------------

    def bisect(
        self,
        target: SloTarget,
        members: Sequence[int],
        seeds: Sequence[int],
        hints: dict[int, int],
        score: Callable[[int, int], float] | None = None,
        keep: int = 0,
    ) -> dict[int, tuple[int, int]]:
        """Each member's bracket (lo, hi) over `seeds`: lo its goodput index once hi = lo + 1; all
        members' probes of a step run together. With `score` and `keep`, branch and bound: a member
        stops early once even its best possible score (at the load below its first miss) is under
        the keep-th best score already met; its bracket stays open."""
        num_loads = len(self.loads)
        lo = dict.fromkeys(members, -1)
        hi = dict.fromkeys(members, num_loads)
        # From a hint: probe it, then gallop away from it (1, 2, 4, ... steps) in the direction its
        # outcome points until the outcome flips; bisect the bracket that leaves.
        gallop: dict[int, tuple[int, int] | None] = dict.fromkeys(members)
        stopped: set[int] = set()
        while True:
            if score is not None and keep:
                met = sorted((score(c, lo[c]) for c in members), reverse=True)
                threshold = met[min(keep, len(met)) - 1]
                stopped |= {c for c in members if hi[c] - lo[c] > 1 and score(c, hi[c] - 1) < threshold}
            probes: dict[int, int] = {}
            for c in members:
                if hi[c] - lo[c] > 1 and c not in stopped:
                    fresh = lo[c] == -1 and hi[c] == num_loads
                    hint = hints.get(c) if fresh else None
                    probes[c] = hint if hint is not None else self._next_probe(lo[c], hi[c], gallop[c])
            if not probes:
                return {c: (lo[c], hi[c]) for c in members}
            self.ensure([(c, li, s) for c, li in probes.items() for s in seeds])
            for c, li in probes.items():
                ok = self.meets(target, c, li, seeds)
                first = lo[c] == -1 and hi[c] == num_loads
                lo[c], hi[c] = (li, hi[c]) if ok else (lo[c], li)
                direction = 1 if ok else -1
                g = gallop[c]
                if first and li == hints.get(c):
                    gallop[c] = (direction, 1)
                elif g is not None:
                    gallop[c] = (direction, 2 * g[1]) if direction == g[0] else None

    @staticmethod
    def _next_probe(lo: int, hi: int, gallop: tuple[int, int] | None) -> int:
        """Galloping: `step` loads past the bracket's end the last outcome moved; else its middle."""
        if gallop is not None:
            direction, step = gallop
            return min(max(lo + step if direction > 0 else hi - step, lo + 1), hi - 1)
        return (lo + hi) // 2

    def exhaustive(self, target: SloTarget, members: Sequence[int]) -> dict[int, int]:
        """Goodput index over every seed with every load replayed: the highest load up to which every
        load meets the target. Not the highest that meets it: near its limit a design's tail can
        meet a target at one load and miss it at a lower one (a few long prompts landing together
        or not), and a plan cannot promise a load above one it missed."""
        seeds = list(self.seeds)
        loads = range(len(self.loads))
        self.ensure([(c, li, s) for c in members for li in loads for s in seeds])
        return {
            c: next((li - 1 for li in loads if not self.meets(target, c, li, seeds)), len(self.loads) - 1)
            for c in members
        }

    def halving(
        self, target: SloTarget, members: Sequence[int], score: Callable[[int, int], float]
    ) -> dict[int, Outcome]:
        """Successive halving over seeds; `score(candidate, goodput index)` ranks (higher first)."""
        outcomes: dict[int, Outcome] = {}
        alive, hints = list(members), dict[int, int]()
        num_seeds, round_no = 1, 1
        while alive:
            seeds = tuple(self.seeds[:num_seeds])
            last = num_seeds >= len(self.seeds)
            keep = 1 if last else math.ceil(len(alive) / 2)
            brackets = self.bisect(target, alive, seeds, hints, score, keep)
            for c, (lo, hi) in brackets.items():
                outcomes[c] = Outcome(lo, seeds)
                if last and hi - lo > 1:
                    outcomes[c].dropped = BOUNDED
                    outcomes[c].goodput_under = self.loads[hi] if hi < len(self.loads) else None
            if last:
                break
            scores = {c: score(c, brackets[c][0]) for c in alive}
            cut = sorted(scores.values(), reverse=True)[keep - 1]
            survivors = [c for c in alive if scores[c] >= cut]  # ties at the cut stay
            for c in alive:
                if c not in survivors:
                    outcomes[c].dropped = f"cut in halving round {round_no} ({_seeds(len(seeds))})"
            # The next round starts from this one's answer (a candidate that met nothing: the lowest load).
            alive, hints = survivors, {c: max(brackets[c][0], 0) for c in survivors}
            num_seeds, round_no = min(2 * num_seeds, len(self.seeds)), round_no + 1
        return outcomes


def _seeds(n: int) -> str:
    return "1 seed" if n == 1 else f"{n} seeds"
