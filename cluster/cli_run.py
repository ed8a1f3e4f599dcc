"""`testbed run` and `testbed replay`: each design once (virtual or live), into one run directory.

testbed run    --preset guide-l40s [--design collocated] [--rate 0.4] [--mode live] [--out DIR]
testbed replay --trace PATH [--format auto|mooncake|azure|weka] [--router kv_aware] [--timing think]
               [--speedup X] [--window A:B] [--max-sessions N] [--session-salt]   (or --scenario six-turn)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import sys
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cluster.config_load import ConfigError, dump_config, load_designs, needs_trace
from cluster.estimate import estimate_line
from cluster.interrupt import Interrupted
from cluster.outcome import clean_json, write_json
from cluster.progress import RunProgress
from dashboards.headline import outcome
from dashboards.report import write_report
from emulation.config import TestbedConfig
from messages import RequestResult
from workloads.divergence import diverged_at
from workloads.replay import LoadedWorkload, load_workload
from workloads.run_summary import LagFigures
from workloads.traces.session import Trace, TraceError

if TYPE_CHECKING:
    import pandas as pd

SCENARIOS: dict[str, list[str]] = {
    "six-turn": [
        "workload.kind=multi_turn",
        "multi_turn.num_conversations=1",
        "multi_turn.num_turns=constant:6",
        "multi_turn.common_prefix_tokens=0",
        "multi_turn.prefix_tokens=constant:3600",
        "multi_turn.user_tokens=constant:400",
        "multi_turn.output_tokens=constant:600",
        "multi_turn.think_s=constant:5",
    ],
}
"""Named multi-turn workloads: six-turn is a chat whose first prompt is 4,000 tokens, then answers of
600 and follow-ups of 400, six turns."""


def overrides(args: argparse.Namespace) -> list[str]:
    """CLI shortcuts become `--set` overrides, so every path goes through one validation."""
    out = []
    for flag, key in (
        ("compute", "runner.compute"),
        ("mode", "clock.mode"),
        ("rate", "workload.rate"),
        ("num_requests", "workload.num_requests"),
        ("seed", "seed"),
        ("output_policy", "workload.output_policy"),
        ("time_scale", "clock.time_scale"),
        ("trace", "replay.trace"),
        ("format", "replay.format"),
        ("timing", "replay.timing"),
        ("speedup", "replay.speedup"),
        ("max_sessions", "replay.max_sessions"),
        ("max_turns", "replay.max_turns"),
        ("router", "router.policy"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            out.append(f"{key}={value}")
    return out + list(args.set or [])


def configs_of(args: argparse.Namespace, extra: Sequence[str] = ()) -> list[TestbedConfig]:
    return load_designs(args.config or args.preset, design_names(args), [*extra, *overrides(args)])


def design_names(args: argparse.Namespace) -> list[str] | None:
    """`--design A,B` as names (None: every design of the source)."""
    return [d for d in (args.design or "").split(",") if d] or None


def trace_source(args: argparse.Namespace) -> str | None:
    """`--preset NAME` (or `--config FILE`) when a design of it replays a trace it does not name, which
    only a command given the trace runs; else None."""
    source = args.config or args.preset
    if not needs_trace(source, design_names(args), overrides(args)):
        return None
    return f"--config {source}" if args.config else f"--preset {source}"


def out_dir(args: argparse.Namespace, kind: str) -> Path:
    out = Path(args.out or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "configs").mkdir(exist_ok=True)
    return out


def cmd_run(args: argparse.Namespace) -> int:
    if (flag := trace_source(args)) is not None:  # the command to use, not a config key
        design = f" --design {args.design}" if args.design else ""
        command = f"testbed replay {flag}{design} --trace FILE"
        raise ConfigError(f"{flag.replace(' ', '=')} replays a trace; run it with: {command}")
    configs = configs_of(args)
    c = configs[0]
    return _run_designs(args, configs, "run", [workload_note(c)], c.workload.num_requests)


def workload_note(cfg: TestbedConfig) -> str:
    """The report's line on a synthetic workload: how many requests, sent how (open loop at a rate, or
    closed loop at a concurrency), the warm-up left out of the figures, their lengths, the seed."""
    w = cfg.workload
    sent = f"at {w.rate:g} req/s"
    if w.max_concurrency is not None:
        sent = f"{w.max_concurrency} at once (closed loop)"
    warmup = f", the first {w.num_warmup_requests} a warm-up" if w.num_warmup_requests else ""
    spread = f" (each ±{w.random_range_ratio:.0%})" if w.random_range_ratio else ""
    return (
        f"workload: {w.num_requests} requests {sent}{warmup}, prompt {w.prompt_len}, output "
        f"{w.output_len}{spread}, seed {cfg.seed}"
    )


def cmd_replay(args: argparse.Namespace) -> int:
    """A trace's sessions (or a named multi-turn scenario, or the preset's own sessions) through each
    design."""
    if args.trace is not None and args.scenario is not None:
        raise ConfigError("testbed replay: give --trace PATH or --scenario NAME, not both")
    extra = ["workload.kind=trace"] if args.trace else list(SCENARIOS.get(args.scenario, []))
    if args.window:
        try:
            start, end = (float(x) for x in args.window.split(":"))
        except ValueError:
            raise ConfigError(
                f"--window={args.window!r}: expected START:END in trace seconds, e.g. 0:600"
            ) from None
        extra.append(f"replay.window_s=[{start},{end}]")
    if args.session_salt:
        extra.append("replay.session_salt=true")
    if args.target and args.design:
        raise ConfigError(
            f"--design={args.design}: designs apply to the testbed only; --target replays once, "
            "against the server (drop --design)"
        )
    configs = configs_of(args, extra)
    if args.target:  # one pass, labelled by the server: the workload's settings come from the config
        configs = [dataclasses.replace(configs[0], design=target_label(args.target))]
    c = configs[0]
    if c.workload.kind == "synthetic":
        raise ConfigError(
            "testbed replay: give --trace PATH or --scenario NAME (the preset has no sessions of its own)"
        )
    loaded = None
    if c.workload.kind == "trace":
        loaded = load_workload(c)  # loaded, checked and measured here, once for every design
        trace = loaded.workload
        assert isinstance(trace, Trace)
        window = c.replay.window_s
        part = f", window {window[0]:g}-{window[1]:g} s" if window is not None else ""
        what = (
            f"trace {trace.name}{part}: {len(trace.sessions)} sessions, {trace.num_requests} requests "
            f"at {loaded.info['rate']:.3g} req/s"
        )
        total: int | None = trace.num_requests
        hit_rate = loaded.info["theoretical_prefix_hit_rate"]
        if c.replay.history == "model" and hit_rate is None and not args.target:
            raise ConfigError(
                "replay.history='model': a chat trace's next turns need the server's answers as messages:"
                " replay it with --target URL (a `testbed serve` or vLLM), or with replay.history=trace"
            )
        reuse = (
            f"theoretical prefix-hit rate {hit_rate:.1%} (infinite cache, prompts only)"
            if hit_rate is not None
            else "chat prompts, rendered when sent"
        )
    else:
        what = f"scenario {args.scenario or c.design}"
        total = None
        reuse = "multi-turn conversations"
    r = c.replay
    notes = [
        f"{what}; timing {r.timing}, speedup {r.speedup:g}, router {c.router.policy}; {reuse}",
    ]
    if args.target:
        notes.append(f"against {args.target}: client-side times, in wall seconds")
    return _run_designs(args, configs, "replay", notes, total, loaded)


def target_label(url: str) -> str:
    """A replay against `url`'s name in results and file names: `target-HOST-PORT`."""
    netloc = urllib.parse.urlsplit(url).netloc or url
    return "target-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", netloc).strip("-")


def _run_designs(
    args: argparse.Namespace,
    configs: list[TestbedConfig],
    kind: str,
    notes: list[str],
    total: int | None,
    loaded: LoadedWorkload | None = None,
) -> int:
    """Each design of `configs` through `loaded` (None: each its own workload, as `run` draws it)."""
    import pandas as pd

    from cluster.calibrate import resolve_time_scale
    from dashboards.console import run_table, show, turns_table

    reference = _reference(args, configs)  # checked before anything runs
    configs = [resolve_time_scale(c, args.address) if c.clock.mode == "live" else c for c in configs]
    out = out_dir(args, kind)
    for cfg in configs:  # the resolved configs, before anything runs
        dump_config(cfg, out / "configs" / f"{cfg.design}.yaml")
    runs = _DesignRuns(out, loaded)
    live = [] if getattr(args, "target", None) else configs  # a target needs no Ray
    # Designs in virtual time are independent: one process each, as a sweep's points.
    parallel = len(configs) > 1 and not getattr(args, "target", None)
    parallel = parallel and all(c.clock.mode == "virtual" for c in configs)
    num_parallel = (os.cpu_count() or 1) if parallel else 1  # run_in_processes: one process a core
    estimate = None if getattr(args, "target", None) else estimate_line(configs, loaded, num_parallel)
    if estimate is not None:
        print(estimate, flush=True)
    try:
        with _ray_session(live, args.address):
            outputs = _run_virtual_designs(configs, loaded) if parallel else None
            for i, cfg in enumerate(configs):
                result = outputs[i] if outputs is not None else _run_one(cfg, args, total, loaded, runs)
                runs.add(cfg, result)
    except KeyboardInterrupt as e:
        raise runs.interrupted(configs, e, total) from None
    records = runs.records
    results = pd.concat(runs.frames, ignore_index=True)
    if reference is not None:  # greedy tokens against the reference design's: wrong KV shows here
        results["diverged_at"] = diverged_at(results, reference)
        for r in records:
            rows = results[results["design"] == r["design"]]
            r["diverged_fraction"] = float(rows["diverged_at"].notna().mean()) if len(rows) else 0.0
            r["reference"] = reference
    results.to_parquet(out / "results.parquet", index=False)
    write_json(out / "summary.json", records)
    write_json(out / "engines.json", clean_json(runs.engines))
    c = configs[0]
    title = f"testbed {kind}: {c.target.model}"
    if getattr(args, "target", None):  # a real server: none of the testbed's own settings applied
        title = f"testbed {kind} against {args.target}"
        notes = [*notes, "the workload's settings from the config; no design, emulated target or clock"]
    else:
        notes = [
            f"target {c.target.model}; designs {', '.join(x.design for x in configs)}",
            f"{c.clock.mode} mode, compute {c.runner.compute}, time_scale "
            + ", ".join(f"{x.clock.time_scale:g}" for x in configs if x.clock.time_scale != "auto"),
            *notes,
            "final Prometheus exposition of every actor: metrics/<design>/<actor>.prom",
        ]
    hybrid = not getattr(args, "target", None) and c.target.profile.ssm is not None
    report = write_report_saying_so(out, results, records, title, notes, hybrid)
    show(run_table(records), *filter(None, [turns_table(results)]))
    warn_of_failures(results)
    print(f"run directory: {out}  (report: {report})")
    return 0


def write_report_saying_so(
    out: Path,
    results: pd.DataFrame,
    records: list[dict[str, Any]],
    title: str,
    notes: list[str],
    hybrid: bool,
) -> Path:
    """`write_report`, saying so at once and counting its plots as they are written (it takes seconds to
    tens of seconds for a large run)."""
    with RunProgress("writing report: plots", None) as progress:
        return write_report(out, results, records, title, notes, hybrid, on_plot=lambda _: progress.advance())


def warn_of_failures(results: pd.DataFrame) -> None:
    """One line per design with failed requests: how many succeeded, and the top reasons in words."""
    for finding in outcome(results):
        if finding.warn:
            print(f"warning: {finding.text}", file=sys.stderr)


def _reference(args: argparse.Namespace, configs: list[TestbedConfig]) -> str | None:
    """The design whose greedy tokens the others are checked against: `--reference`, or `collocated`
    when the run has it, computes for real and samples greedy."""
    names = [c.design for c in configs]
    chosen = getattr(args, "reference", None)
    if chosen is not None:
        if chosen not in names:
            raise ConfigError(
                f"--reference={chosen!r}: not a design of this run; allowed: {', '.join(names)}"
            )
        return str(chosen)
    greedy = all(c.workload.output_policy == "greedy" and c.runner.compute == "real" for c in configs)
    return "collocated" if greedy and "collocated" in names and len(names) > 1 else None


def _run_virtual_designs(configs: list[TestbedConfig], loaded: LoadedWorkload | None) -> list[Any]:
    """Each design in virtual time (through `loaded`), in worker processes, under a progress display
    of designs."""
    from cluster.sweep import run_in_processes

    with RunProgress(f"{len(configs)} designs, in parallel", len(configs)) as progress:
        designs = [(cfg, loaded) for cfg in configs]
        return run_in_processes(_virtual_design, designs, on_done=progress.advance)


def _virtual_design(design: tuple[TestbedConfig, LoadedWorkload | None]) -> Any:
    """One design in virtual time, its metrics rendered (to come back from a worker process); stopped by
    Ctrl-C, the requests it finished (`_partial_output`) kept."""
    from cluster.sweep import Stopped
    from cluster.virtual import run_virtual

    cfg, loaded = design
    finished: list[RequestResult] = []
    try:
        out = run_virtual(cfg, loaded, on_result=finished.append)
    except KeyboardInterrupt:
        raise Stopped(_partial_output(cfg, finished, loaded)) from None
    return dataclasses.replace(out, metrics=dict(out.metrics))


def _partial_output(cfg: TestbedConfig, finished: list[RequestResult], loaded: LoadedWorkload | None) -> Any:
    """The requests a design finished before Ctrl-C stopped it, as a run of their own, marked
    `interrupted` (its engines' reports and metrics went with it)."""
    from cluster.outcome import run_output

    out = run_output(cfg, finished, {}, {}, loaded.info if loaded is not None else {})
    out.summary["interrupted"] = True
    return out


class _DesignRuns:
    """What the designs of a run finished, design by design, and the requests of the one under way:
    written as they are if Ctrl-C stops the run."""

    def __init__(self, out: Path, loaded: LoadedWorkload | None) -> None:
        self.out = out
        self.loaded = loaded
        self.records: list[dict[str, Any]] = []
        self.frames: list[pd.DataFrame] = []
        self.engines: dict[str, Any] = {}
        self.current: list[RequestResult] = []
        """The requests the design under way has finished (in this process: one design at a time)."""

    def add(self, cfg: TestbedConfig, result: Any) -> None:
        """A design finished: its record, results, engine reports and final metrics (written now)."""
        from dashboards.console import lag_warning

        self.current = []
        self.records.append(clean_json(result.summary))
        (self.out / "metrics" / cfg.design).mkdir(parents=True, exist_ok=True)
        for actor, text in result.metrics.items():
            (self.out / "metrics" / cfg.design / f"{actor}.prom").write_text(text)
        self.frames.append(result.results)
        self.engines[cfg.design] = result.engine_reports
        if cfg.clock.mode == "live" and result.summary["lag_fraction"] > 0.01:
            lag_warning(result.summary)

    def interrupted(
        self, configs: list[TestbedConfig], e: KeyboardInterrupt, total: int | None
    ) -> Interrupted:
        """Ctrl-C: the designs finished (in worker processes: those done, `InterruptedRuns`) and the
        requests the one under way finished, written as results, summary and engine reports."""
        import pandas as pd

        from cluster.sweep import InterruptedRuns

        if isinstance(e, InterruptedRuns):  # (those under way: what they finished, `_virtual_design`)
            for i in sorted(e.done):
                self.add(configs[i], e.done[i])
        elif self.current:
            cfg = configs[len(self.frames)]
            self.add(cfg, _partial_output(cfg, self.current, self.loaded))
        num_done = sum(len(f) for f in self.frames)
        if self.frames:
            pd.concat(self.frames, ignore_index=True).to_parquet(self.out / "results.parquet", index=False)
        write_json(self.out / "summary.json", self.records)
        write_json(self.out / "engines.json", clean_json(self.engines))
        return Interrupted(num_done, total and total * len(configs), self.out)


def _run_one(
    cfg: TestbedConfig,
    args: argparse.Namespace,
    total: int | None,
    loaded: LoadedWorkload | None,
    runs: _DesignRuns,
) -> Any:
    """One design, virtual or live (or against a `--target` server), under a progress display; each
    request it finishes goes to `runs.current`."""
    with RunProgress(f"{cfg.design}: requests", total) as progress:

        def on_result(result: RequestResult) -> None:
            runs.current.append(result)
            progress.advance()

        target = getattr(args, "target", None)
        if target:
            from cluster.target_run import run_against_target

            return run_against_target(cfg, target, args.model, args.api_key, on_result, loaded)
        if cfg.clock.mode == "virtual":
            from cluster.virtual import run_virtual

            return run_virtual(cfg, loaded, on_result=on_result)
        from cluster.live import run_live

        def on_tick(sim_s: float, lag: LagFigures) -> None:
            progress.describe(f"{cfg.design}: t={sim_s:.1f} s emulated, lag {lag['lag_fraction']:.1%}")

        return run_live(cfg, args.address, loaded, on_result=on_result, on_tick=on_tick)


@contextlib.contextmanager
def _ray_session(configs: list[TestbedConfig], address: str | None) -> Iterator[None]:
    """One Ray for all live runs of a command: joined at `address`, or started here and stopped after."""
    if not any(c.clock.mode == "live" for c in configs):
        yield
        return
    from cluster.ray_connect import connect, disconnect

    started = connect(configs, address)
    try:
        yield
    finally:
        if started:
            disconnect()


ERRORS = (ConfigError, TraceError)
"""What ends a command with one line and exit code 2."""
