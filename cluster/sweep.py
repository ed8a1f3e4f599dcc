"""Sweeps: designs × rates × seeds, each point a fresh virtual deployment, run in parallel processes (as
are a replay's designs: `run_in_processes`)."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import multiprocessing
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from typing import Any, TypeVar

import pandas as pd

from cluster.load import with_load
from cluster.outcome import clean_json
from cluster.virtual import RARE_GC_THRESHOLDS, run_virtual
from emulation.config import TestbedConfig, WorkloadConfig
from workloads.summary import mean_records

T = TypeVar("T")
R = TypeVar("R")


@dataclasses.dataclass
class SweepOutput:
    runs: list[dict[str, Any]]
    """One record per design × rate × seed."""
    records: list[dict[str, Any]]
    """One record per design × rate: means over seeds."""
    results: pd.DataFrame
    engines: dict[str, dict[str, Any]]
    """engines.json's reports: design -> `point_engine` -> the engine's report (as JSON), every point's
    engines (a MoE target's step logs among them: the report's MoE figure and table)."""
    complete: bool = True
    """False: Ctrl-C stopped the sweep; the rest are of the points finished by then."""


def sweep_points(
    configs: Sequence[TestbedConfig], rates: Sequence[float], seeds: Sequence[int]
) -> list[TestbedConfig]:
    """Each design at each load (`rates`: `cluster.load`'s, whatever the workload) and seed."""
    return [with_load(cfg, rate, seed) for cfg in configs for rate in rates for seed in seeds]


def _start_method() -> str:
    """How worker processes start: fork where it is safe (POSIX; no other Python thread, no Ray and no
    torch in this process), so that they start with everything imported (spawn imports it all again
    in each, ~0.6 s on a small machine); else spawn."""
    if "fork" not in multiprocessing.get_all_start_methods() or threading.active_count() > 1:
        return "spawn"
    ray = sys.modules.get("ray")
    if "torch" in sys.modules or (ray is not None and ray.is_initialized()):
        return "spawn"
    return "fork"


def _workload_of(cfg: TestbedConfig) -> WorkloadConfig:
    """What decides a point's requests but for their rate."""
    return dataclasses.replace(cfg.workload, rate=1.0)


def point_engine(engine: str, rate: float, seed: int) -> str:
    """An engine of one sweep point, as engines.json and the report name it: `decode-0 at 2 req/s, seed 0`."""
    return f"{engine} at {rate:g} req/s, seed {seed}"


def _run_point(cfg: TestbedConfig) -> tuple[dict[str, Any], pd.DataFrame, dict[str, Any]]:
    """A point's record, results and its engines' reports (as JSON: plain values to send back); a sweep
    keeps no metrics."""
    out = run_virtual(cfg, metrics=False)
    rate, seed = out.summary["rate"], cfg.seed
    reports = {point_engine(e, rate, seed): clean_json(r) for e, r in out.engine_reports.items()}
    return {**out.summary, "seed": seed}, out.results, reports


def _start_worker() -> None:
    """A worker ignores Ctrl-C between items (during one, `_interruptible` lets it stop the item), and
    collects cycles at `RARE_GC_THRESHOLDS` throughout: restored between its runs, the default
    collected once at each run's end with the whole deployment alive (~6 % of a guide point)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.set_threshold(*RARE_GC_THRESHOLDS)


class InterruptedRuns(KeyboardInterrupt):
    """Ctrl-C stopped `run_in_processes`: the results of the items finished by then, by index (an item
    under way that raised `Stopped`: what it kept)."""

    def __init__(self, done: dict[int, Any]) -> None:
        super().__init__()
        self.done = done


class Stopped(KeyboardInterrupt):
    """What an item of `run_in_processes` raises when Ctrl-C stops it and it keeps what it finished."""

    def __init__(self, kept: Any) -> None:
        super().__init__(kept)  # (the argument, so that it pickles back from a worker)
        self.kept = kept


def run_in_processes(
    fn: Callable[[T], R],
    items: Sequence[T],
    jobs: int | None = None,
    on_done: Callable[[], None] | None = None,
) -> list[R]:
    """`fn` of each item, on up to `jobs` worker processes (default: one a core; one: in this
    process), in the items' order; `on_done` after each. `fn` must be a module-level function.
    Ctrl-C raises `InterruptedRuns` with the items done (those it stopped that raised `Stopped`: what
    they kept), once the workers are stopped."""
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(items)))
    done: dict[int, R] = {}
    try:
        if jobs == 1:
            _in_this_process(fn, items, done, on_done)
        else:
            _in_workers(fn, items, jobs, done, on_done)
    except KeyboardInterrupt:
        raise InterruptedRuns(done) from None
    return [done[i] for i in range(len(items))]


def _in_this_process(
    fn: Callable[[T], R], items: Sequence[T], done: dict[int, R], on_done: Callable[[], None] | None
) -> None:
    for i, item in enumerate(items):
        try:
            done[i] = fn(item)
        except Stopped as e:
            done[i] = e.kept
            raise
        if on_done:
            on_done()


def _in_workers(
    fn: Callable[[T], R],
    items: Sequence[T],
    jobs: int,
    done: dict[int, R],
    on_done: Callable[[], None] | None,
) -> None:
    """One item a worker at a time, not the pool's queue ahead: at Ctrl-C, no item waits to start in a
    worker that has just stopped its own."""
    with _workers(jobs) as pool:
        waiting = iter(enumerate(items))
        running = {pool.submit(_interruptible, fn, item): i for i, item in itertools.islice(waiting, jobs)}
        try:
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    done[running[future]] = future.result()
                    del running[future]
                    if on_done:
                        on_done()
                    for i, item in itertools.islice(waiting, 1):
                        running[pool.submit(_interruptible, fn, item)] = i
        except KeyboardInterrupt:
            done.update(_stopped(pool, running))
            raise


STOP_WAIT_S = 2.0
"""How long items under way get to stop at Ctrl-C before the signal is passed on to their workers (a
terminal sends it to them too; `kill -INT` to the command alone does not), and as long again after."""


def _stopped(pool: ProcessPoolExecutor, futures: dict[Future[R], int]) -> dict[int, R]:
    """Ctrl-C: the items under way (`futures`, by index) stop at their next event (`_interruptible`);
    what those that finish or raise `Stopped` keep, by index."""
    running = [f for f in futures if not f.done()]
    if wait(running, STOP_WAIT_S).not_done:
        for process in list(pool._processes.values()):  # (the pool's own; no public handle)
            if process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGINT)
        wait(running, STOP_WAIT_S)
    kept = {}
    for future, i in futures.items():
        if future.done():
            e = future.exception()
            if e is None or isinstance(e, Stopped):
                kept[i] = future.result() if e is None else e.kept
    return kept


def _interruptible(fn: Callable[[T], R], item: T) -> R:
    """In a worker, which ignores Ctrl-C between items: `fn(item)`, Ctrl-C raising KeyboardInterrupt in
    it (a virtual run's between two events)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return fn(item)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def _workers(jobs: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of `jobs` worker processes, stopped at once if its user is interrupted."""
    with warnings.catch_warnings():
        # Python 3.12+ warns of forking beside native threads; numpy's BLAS pool is fork-safe.
        warnings.filterwarnings("ignore", r"This process .* is multi-threaded", DeprecationWarning)
        pool = ProcessPoolExecutor(jobs, get_context(_start_method()), initializer=_start_worker)
    try:
        yield pool
    except BaseException:
        processes = list(pool._processes.values())  # (Python 3.14's terminate_workers, by hand)
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
            process.join()
        raise
    pool.shutdown()


def run_sweep(
    points: Sequence[TestbedConfig], jobs: int | None = None, on_done: Callable[[], None] | None = None
) -> SweepOutput:
    """Every point (`complete` False: Ctrl-C stopped the sweep, and these are the points it finished)."""
    # Points with the same workload run back to back, so that a process draws its prompts once.
    order = sorted(range(len(points)), key=lambda i: (points[i].seed, repr(_workload_of(points[i]))))
    try:
        finished = dict(enumerate(run_in_processes(_run_point, [points[i] for i in order], jobs, on_done)))
    except InterruptedRuns as e:
        finished = e.done
    done = {order[i]: output for i, output in finished.items()}  # by point
    outputs = [done[i] for i in sorted(done)]
    runs = [r for r, _, _ in outputs]
    engines: dict[str, dict[str, Any]] = {}
    for r, _, reports in outputs:
        engines.setdefault(r["design"], {}).update(reports)
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["design"], r["rate"]), []).append(r)
    records = []
    for (design, rate), group in groups.items():
        rec = mean_records([{k: v for k, v in g.items() if k != "seed"} for g in group])
        rec.update(design=design, rate=rate, num_seeds=len(group))
        records.append(rec)
    table = pd.concat([df for _, df, _ in outputs], ignore_index=True) if outputs else pd.DataFrame()
    return SweepOutput(runs, records, table, engines, complete=len(outputs) == len(points))
