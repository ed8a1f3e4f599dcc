"""`testbed`: run one design or sweep designs × rates × seeds, writing a reproducible run directory.

testbed run   --preset guide-l40s [--design collocated] [--rate 0.4] [--set key=value ...] [--out DIR]
testbed replay --trace PATH [--router kv_aware] [--mode live] ...       (see cluster/cli_run.py)
testbed sweep --preset guide-l40s --rates 0.2,0.4 --seeds 5 --num-requests 100 [--out DIR]
testbed plan  --preset guide-l40s --slo 'ttft:p90<=2s,tpot:p90<=50ms' [--vary KEY=V1,V2 ...] (docs/plan.md)
testbed presets (the presets, what each emulates, their designs, which replay a trace)
testbed dashboards up [--host 127.0.0.1] [--port 9090] | testbed dashboards down
testbed serve --preset guide-l40s --design pd-fast [--host 127.0.0.1] [--port 8000] [--api-key KEY]
              [--ray [--address ADDR]]
testbed --version
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, NoReturn

from cluster.cli_args import add_command, add_replay_args, add_run_args
from cluster.cli_run import (
    ERRORS,
    cmd_replay,
    cmd_run,
    configs_of,
    out_dir,
    trace_source,
    warn_of_failures,
    write_report_saying_so,
)
from cluster.config_load import ConfigError, available_presets, dump_config, needs_trace, preset_designs
from cluster.interrupt import EXIT_CODE, Interrupted
from cluster.load import closed_loop_refusal, load_key
from cluster.outcome import clean_json, write_json
from cluster.plan.cli import ERRORS as PLAN_ERRORS
from cluster.plan.cli import add_plan_parser, cmd_plan
from cluster.plan.load_unit import LOAD_UNITS
from emulation.config import TestbedConfig


def _parse_rates(text: str) -> list[float]:
    items = text.split(",")
    if any(not x.strip() for x in items):
        raise ConfigError(f"--rates={text!r}: an empty item; expected comma-separated numbers, e.g. 0.2,0.4")
    try:
        rates = [float(x) for x in items]
    except ValueError:
        raise ConfigError(f"--rates={text!r}: expected comma-separated numbers, e.g. 0.2,0.4") from None
    bad = [r for r in rates if not r > 0]
    if not rates or bad:
        raise ConfigError(f"--rates={text!r}: every rate must be > 0 requests/s")
    return rates


def cmd_sweep(args: argparse.Namespace) -> int:
    from cluster.progress import RunProgress
    from cluster.sweep import run_sweep, sweep_points
    from dashboards.console import goodput_table, show, sweep_table
    from workloads.summary import sweep_goodput

    rates = _parse_rates(args.rates)
    if args.mode not in (None, "virtual"):
        raise ConfigError(f"--mode={args.mode}: testbed sweep runs virtual mode; use testbed run --mode live")
    if args.seeds < 1:
        raise ConfigError(f"--seeds={args.seeds}: must be >= 1 (the number of seeds per point)")
    if (flag := trace_source(args)) is not None:  # the command to use, not a config key
        raise ConfigError(
            f"{flag.replace(' ', '=')} replays a trace; sweep its speedup with: testbed sweep {flag} "
            "--set replay.trace=FILE --rates 0.5,1,2"
        )
    configs = configs_of(args)
    if (problem := closed_loop_refusal(configs[0], "sweep")) is not None:
        raise ConfigError(problem)
    out = out_dir(args, "sweep")
    for cfg in configs:
        dump_config(cfg, out / "configs" / f"{cfg.design}.yaml")
    points = sweep_points(configs, rates, [configs[0].seed + i for i in range(args.seeds)])
    start = time.perf_counter()
    with RunProgress(f"{len(points)} runs", len(points)) as progress:
        result = run_sweep(points, args.jobs, on_done=progress.advance)
    wall_s = time.perf_counter() - start
    records = clean_json(result.records)
    goodput = sweep_goodput(records)
    result.results.to_parquet(out / "results.parquet", index=False)
    write_json(out / "runs.json", clean_json(result.runs))
    write_json(out / "summary.json", records)
    write_json(out / "engines.json", result.engines)  # the report's MoE figure and table read it
    write_json(out / "goodput.json", goodput)
    num_requests = sum(r["completed"] + r["failed"] + r["rejected"] for r in result.runs)
    write_json(
        out / "timing.json",
        {
            "wall_s": wall_s,
            "num_runs": len(points),
            "num_requests": num_requests,
            "requests_per_wall_s": num_requests / wall_s,
        },
    )
    if not result.complete:  # Ctrl-C: the points finished are written, no report
        synthetic = configs[0].workload.kind == "synthetic"
        raise Interrupted(
            num_requests, len(points) * configs[0].workload.num_requests if synthetic else None, out
        )
    title = f"{configs[0].target.model}: {len(configs)} designs x {len(rates)} rates x {args.seeds} seeds"
    hybrid = configs[0].target.profile.ssm is not None
    report = write_report_saying_so(out, result.results, records, title, _sweep_notes(configs, args), hybrid)
    show(sweep_table(records, title), goodput_table(goodput))
    warn_of_failures(result.results)
    print(f"{len(points)} runs, {num_requests} requests in {wall_s:.1f} s wall; run directory: {out}")
    print(f"report: {report}")
    return 0


def _sweep_notes(configs: list[TestbedConfig], args: argparse.Namespace) -> list[str]:
    """What a sweep's report says it ran."""
    c = configs[0]
    unit = LOAD_UNITS[load_key(c)].unit
    return [
        f"designs {', '.join(x.design for x in configs)}; loads {args.rates} {unit}; {args.seeds} seed(s) "
        f"from {c.seed}; virtual mode, compute {c.runner.compute}",
        f"workload: {c.workload.num_requests} requests per point, prompt {c.workload.prompt_len}, "
        f"output {c.workload.output_len}; table and curves: means over seeds",
    ]


def cmd_dashboards(args: argparse.Namespace) -> int:
    from dashboards.stack import StackError, down, up

    if args.action == "down":
        stopped = down()
        print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
        return 0
    try:
        stack = up(args.host, args.port, args.grafana_port, args.scrape_interval)
    except StackError as e:
        raise ConfigError(str(e)) from None
    print(f"Prometheus: {stack.prometheus_url}  (targets: {stack.prometheus_url}/targets)")
    if stack.grafana_url:
        boards = "overview, P/D handoff, roles, sessions"
        print(f"Grafana:    {stack.grafana_url}  (folder disagg-testbed: {boards})")
    else:
        print(
            "Grafana:    not installed; provision yours from dashboards/grafana/provisioning/\n"
            "            (set TESTBED_PROMETHEUS_URL and TESTBED_DASHBOARDS_DIR), or import its JSON boards"
        )
    print(f"state, logs: {stack.state_dir}; stop with: testbed dashboards down")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from cluster.calibrate import resolve_time_scale
    from cluster.serve import serve

    configs = configs_of(args)
    if args.design and len(configs) != 1:
        names = ", ".join(c.design for c in configs)
        raise ConfigError(f"--design={args.design}: serve runs one design; choose one of: {names}")
    cfg = resolve_time_scale(configs[0], args.address)
    out = Path(args.out) if args.out else None
    serve(
        cfg,
        args.host,
        args.port,
        out,
        args.api_key,
        args.max_body_bytes,
        args.ray or bool(args.address),
        args.address,
    )  # until Ctrl-C: it raises Interrupted, saying where the results are


def cmd_presets(args: argparse.Namespace) -> int:
    from dashboards.console import presets_table, show

    show(presets_table(preset_designs(), {name for name in available_presets() if needs_trace(name)}))
    print("a design YAML of your own: testbed run --config FILE (example: docs/examples/my-design.yaml)")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line naming it (not a usage block), and help shows defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default where it has one of its own (None: the config's value applies); a
    description's or epilog's indented lines (examples) as written, its others filled to the width."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(
            indent + line if line.startswith(" ") else textwrap.fill(line, width, initial_indent=indent)
            for line in text.splitlines()
        )

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False) or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


def _config_args(p: argparse.ArgumentParser, design_help: str) -> None:
    """Where the config comes from and the shortcuts every command shares (all become `--set`)."""
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--preset",
        default="guide-l40s",
        help=f"one of: {', '.join(available_presets())} (their designs: testbed presets)",
    )
    src.add_argument("--config", help="a YAML config file (flat, or base + designs)")
    p.add_argument("--design", help=design_help)
    p.add_argument(
        "--compute",
        choices=["auto", "real", "skip"],
        help="real: the tiny runner model computes every token (real logits and KV); skip: timing only "
        "(the same emulated times, much faster); default auto: real with --output-policy greedy "
        "(where the numerics are checked), else skip",
    )
    p.add_argument(
        "--output-policy",
        choices=["forced", "greedy"],
        help="forced: answers of the workload's lengths (default); greedy: argmax of the runner's "
        "logits (P/D checked token by token against collocated)",
    )
    p.add_argument("--seed", type=int, help="base seed (default: the config's, 0)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override any config field")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="testbed",
        description="Emulate disaggregated LLM serving.",
        epilog="a command's flags and an example: testbed COMMAND --help",
    )
    p.add_argument("--version", action="version", version=f"testbed {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    add_command(sub, "presets")
    d = add_command(sub, "dashboards")
    d.add_argument("action", choices=["up", "down"])
    d.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 exposes them)")
    d.add_argument("--port", type=int, default=9090, help="Prometheus port")
    d.add_argument("--grafana-port", type=int, default=3000)
    d.add_argument("--scrape-interval", default="5s", help="Prometheus scrape interval, e.g. 1s")
    v = add_command(sub, "serve")
    _config_args(v, "the design to serve (default: the preset's first)")
    v.add_argument("--time-scale", help="wall seconds per emulated second, or auto")
    v.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 exposes it)")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--api-key", help="require `Authorization: Bearer KEY`")
    v.add_argument("--max-body-bytes", type=int, default=4 * 1024**2, help="larger bodies get 413")
    v.add_argument("--out", help="write every request's results here at shutdown")
    v.add_argument("--ray", action="store_true", help="run render pool, proxy and engines as Ray actors")
    v.add_argument("--address", help="with --ray: join this Ray cluster (e.g. auto) instead of starting one")
    r = add_command(sub, "run")
    add_run_args(r, _config_args)
    r.add_argument("--num-requests", type=int, help="requests to send (default: the config's)")
    r.add_argument(
        "--rate",
        type=float,
        help="requests per emulated second (default: the config's); inf: every request at t = 0",
    )
    t = add_command(sub, "replay")
    add_run_args(t, _config_args)
    add_replay_args(t)
    s = add_command(sub, "sweep")
    _config_args(s, "comma-separated designs of the preset (default: all)")
    s.add_argument("--mode", help="virtual (sweeps run virtual mode)")
    s.add_argument("--num-requests", type=int, help="requests per point (default: the config's)")
    s.add_argument("--out", help="run directory (default: runs/<time>-<command>)")
    s.add_argument(
        "--rates",
        default="0.2,0.4,0.6,1.0,1.5,2.0",
        help="comma-separated loads: req/s (a synthetic workload), conversations/s (multi-turn), or a "
        "trace's speedup (--set replay.trace=FILE)",
    )
    s.add_argument("--seeds", type=int, default=1, help="seeds per point (base seed, base+1, ...)")
    s.add_argument("--jobs", type=int, default=os.cpu_count(), help="parallel processes")
    add_plan_parser(sub, _config_args)
    return p


def _version() -> str:
    """The installed distribution's version (a checkout run without installing it has none)."""
    try:
        return importlib.metadata.version("disagg-testbed")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: no version)"


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, a bad flag: argparse has printed; its exit code
        return 0 if e.code is None else e.code if isinstance(e.code, int) else 1  # as sys.exit's
    try:
        commands = {
            "run": cmd_run,
            "replay": cmd_replay,
            "sweep": cmd_sweep,
            "dashboards": cmd_dashboards,
            "serve": cmd_serve,
            "presets": cmd_presets,
            "plan": cmd_plan,
        }
        return commands[args.command](args)
    except (*ERRORS, *PLAN_ERRORS) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:  # Ctrl-C, once the command kept what finished
        print(e, file=sys.stderr)
        return EXIT_CODE
    except KeyboardInterrupt:  # Ctrl-C before anything ran, or after everything was written
        print("interrupted", file=sys.stderr)
        return EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
