"""The flags `testbed run` and `testbed replay` take (their commands: `cluster.cli_run`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from cluster.cli_run import SCENARIOS
from emulation.config.serving import ROUTER_POLICIES
from workloads.traces import FORMATS


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
