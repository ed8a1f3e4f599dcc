"""What `testbed`'s subcommands say in their --help (a summary, a description, examples from the README),
and the flags `testbed run` and `testbed replay` take (their commands: `cluster.cli_run`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from cluster.cli_run import SCENARIOS
from emulation.config.serving import ROUTER_POLICIES
from workloads.traces import FORMATS

ABOUT: dict[str, tuple[str, str, list[str]]] = {
    "presets": (
        "list the presets and their designs",
        "List every preset: what it emulates, its designs, and which presets replay a trace (those run "
        "as `testbed replay --preset NAME --trace FILE`). Writes nothing.",
        ["testbed presets"],
    ),
    "dashboards": (
        "start/stop a local Prometheus (+ Grafana) for live runs",
        "Start a Prometheus (and Grafana, if installed), detached, that scrapes every live run and "
        "server of this host; `testbed dashboards down` stops them.",
        ["testbed dashboards up", "testbed dashboards down"],
    ),
    "serve": (
        "an OpenAI-compatible server in front of one design",
        "Serve one design behind an OpenAI-compatible API (/v1/chat/completions, /v1/completions, "
        "/v1/models, /metrics) whose tokens leave at their emulated times, until Ctrl-C. It writes "
        "results only with --out DIR.",
        ["testbed serve --preset guide-l40s --design pd-fast"],
    ),
    "run": (
        "run each design once",
        "Run each design of a preset (or of a YAML config) once on its synthetic workload, in virtual "
        "time or live on Ray, and write a run directory (results.parquet, summary.json, report.html). "
        "Presets that replay a trace run with `testbed replay --trace FILE`.",
        [
            "testbed run --preset guide-l40s --design pd-fast --rate 0.4 --num-requests 20",
            "testbed run --config docs/examples/my-design.yaml --num-requests 20",
        ],
    ),
    "replay": (
        "replay a trace's sessions (or a multi-turn scenario) through each design",
        "Replay a trace's sessions (Mooncake, Azure, WEKA, mini-SWE-agent, ServeGen) or a named "
        "multi-turn scenario through each design, or against a server (--target URL), and write a run "
        "directory with prefix-hit rates and TTFT by turn.",
        [
            "testbed replay --preset agentic-h200 --trace "
            "../shared/traces/mooncake_fast25/conversation_trace.window_0s_1200s.jsonl --window 0:120"
        ],
    ),
    "sweep": (
        "designs x rates x seeds",
        "Run every design at every offered rate and seed in virtual time, in parallel processes, and "
        "write the run directory with each design's goodput per SLO set (goodput.json) and its plot.",
        ["testbed sweep --preset guide-l40s --rates 0.2,0.4,0.6 --num-requests 50"],
    ),
    "plan": (
        "search designs for the most goodput per GPU or dollar under SLOs",
        "Search a space of designs (the source's, crossed with --vary and --shapes) for the one that "
        "sustains the most load per GPU (or per dollar, --rank cost) while meeting every SLO target, "
        "replaying the workload in virtual time; print the ranked candidates and the verdict, and write "
        "plan.json, the recommended design's YAML and a report.",
        [
            "testbed plan --preset guide-l40s --num-requests 40 "
            "--vary scheduler.max_num_batched_tokens=1024,4096"
        ],
    ),
}
"""Each subcommand's one-line summary, description and examples (every one a command of the README)."""


def add_command(sub: Any, name: str) -> argparse.ArgumentParser:
    """The subparser of `name` (`sub`: the parser's subparsers), its help from `ABOUT`."""
    summary, description, examples = ABOUT[name]
    epilog = "example" + ("s" if len(examples) > 1 else "") + ":\n" + "\n".join(f"  {e}" for e in examples)
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=summary, description=description, epilog=epilog
    )
    return parser


def add_run_args(
    s: argparse.ArgumentParser, add_config_args: Callable[[argparse.ArgumentParser, str], None]
) -> None:
    """The flags `run` and `replay` share."""
    add_config_args(s, "comma-separated designs of the preset (default: all)")
    s.add_argument(
        "--mode",
        choices=["virtual", "live"],
        help="virtual: one process, emulated time jumps from event to event (default); live: every role "
        "a Ray actor on a wall clock (slower by the config's time_scale)",
    )
    s.add_argument("--out", help="run directory (default: runs/<time>-<command>)")
    s.add_argument("--time-scale", help="live: wall seconds per emulated second, or auto")
    s.add_argument("--address", help="live: join this Ray cluster (e.g. auto) instead of starting one")


def add_replay_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--trace", help="a trace file, or a directory of WEKA session files")
    s.add_argument("--scenario", choices=sorted(SCENARIOS), help="a named multi-turn workload instead")
    s.add_argument(
        "--format",
        choices=["auto", *FORMATS],
        help="the trace's format (default: auto, from its name and first line)",
    )
    s.add_argument(
        "--router", help=f"the router's policy: {' | '.join(ROUTER_POLICIES)} (default: the config's)"
    )
    s.add_argument(
        "--timing",
        choices=["think", "original", "api-scaled"],
        help="when a session's next turn goes, once the previous one finished: after its think time "
        "(think, default), at its trace time if later (original), or the previous send + its API time x "
        "replay.api_time_scale + think time, if later (api-scaled)",
    )
    s.add_argument("--speedup", type=float, help="divide every trace time and delay by this")
    s.add_argument("--window", help="START:END trace seconds: only sessions starting in it")
    s.add_argument(
        "--max-sessions",
        type=int,
        help="at most N sessions in flight at once (closed-loop users); every session is still replayed",
    )
    s.add_argument("--max-turns", type=int, help="replay at most each session's first N turns")
    s.add_argument("--session-salt", action="store_true", help="no prefix shared across sessions")
    s.add_argument("--reference", help="compare every design's greedy tokens with this design's")
    s.add_argument("--target", help="replay against this OpenAI-compatible server (e.g. http://host:8000)")
    s.add_argument("--model", help="with --target: the model to ask for (default: the first it lists)")
    s.add_argument("--api-key", help="with --target: sent as `Authorization: Bearer KEY`")
