"""How `make test` and `make test-fast` share their tests out between the two cores (pytest-xdist), and
Ctrl-C for the tests `make test` runs in the background."""

from __future__ import annotations

import functools
import signal
from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling

PEER_HELPERS = ("tests.vllm_peer", "tests.vllm_serve")
"""A test module importing one of these runs vLLM's own code in the peer's interpreter (`vllm_peer.py`)."""


class ModulesAndPeer(LoadFileScheduling):
    """`--dist loadfile`: a module's tests are one unit of work, run by one worker (its module-scoped
    fixtures are built once, not once a worker); here the modules that run the vLLM peer are one unit
    together. On a fresh machine the first of them installs vLLM (2-3 minutes, `vllm_peer.py`) under a
    lock: a worker reaching another peer module meanwhile would wait on it, idle. As one unit, they run
    on one worker while the other goes on with the rest; the units with the most tests go out first
    (xdist's order), this one among them."""

    def _split_scope(self, nodeid: str) -> str:
        module = super()._split_scope(nodeid)
        return "vllm-peer" if _runs_the_peer(self.config.rootpath / module) else module


@functools.cache
def _runs_the_peer(module: Path) -> bool:
    return module.suffix == ".py" and any(helper in module.read_text() for helper in PEER_HELPERS)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadFileScheduling | None:
    """`ModulesAndPeer` for `--dist loadfile` (the Makefile's); xdist's own scheduler otherwise."""
    if config.getvalue("dist") != "loadfile":
        return None
    return ModulesAndPeer(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C interrupts a run in the background too. `make test` starts the `ray up` tests as a shell's
    background job, which the shell starts with SIGINT ignored, and Python then installs no handler:
    Ctrl-C would leave them running. With Python's own handler back, it interrupts them as it does a
    run in the foreground, and their fixtures' teardown takes the cluster down."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
