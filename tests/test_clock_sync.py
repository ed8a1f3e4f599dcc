"""The live clock across nodes: offsets by round-trip halving (`cluster.clock_sync`), and a clock
that reads the head's time on a node whose monotonic clock started elsewhere."""

import time

import pytest

from actors.engine.clock import Clock
from cluster.clock_sync import ClockOffset, check_uncertainty, measure, offset_of, sync_summary
from cluster.config_load import ConfigError


def test_the_fastest_probe_gives_the_offset_and_half_its_round_trip_the_uncertainty():
    # (driver mono before, driver wall before, (actor mono, actor wall, node), driver mono after, wall after)
    slow = (10.0, 1000.0, (110.5, 1000.9, "n"), 10.8, 1000.8)  # 0.8 s round trip
    fast = (20.0, 2000.0, (120.07, 2000.3, "n"), 20.1, 2000.1)  # 0.1 s: the one used
    o = offset_of([slow, fast])
    assert o.offset_s == pytest.approx(100.02) and o.uncertainty_s == pytest.approx(0.05)
    assert o.wall_skew_s == pytest.approx(0.25) and o.node == "n"


def test_a_node_whose_monotonic_clock_started_elsewhere_reads_the_heads_time():
    """A 'node' whose monotonic clock reads 1e6 s ahead, 2 ms away each way: measured, a clock there
    (reading its own clock less the offset) agrees with the head's within the uncertainty."""
    ahead_s = 1e6

    def node_monotonic():
        return time.monotonic() + ahead_s

    def ask():
        time.sleep(0.002)
        answer = (node_monotonic(), time.time(), "far")
        time.sleep(0.002)
        return answer

    o = measure(ask, num_probes=4)
    assert o.offset_s == pytest.approx(ahead_s, abs=o.uncertainty_s) and 0.002 <= o.uncertainty_s < 0.05
    epoch = time.monotonic()
    head = Clock(1.0, epoch_s=epoch)
    there = Clock(1.0, epoch_s=epoch, offset_s=o.offset_s, monotonic=node_monotonic)
    assert abs(there.now() - head.now()) <= o.uncertainty_s + 1e-3
    assert abs(Clock(1.0, epoch_s=epoch, offset_s=0.0).now() - head.now()) < 1e-3


def test_an_offset_known_worse_than_the_bound_is_refused_in_one_line_naming_the_node():
    offsets = {"decode-0": ClockOffset("10.0.0.3/abcd1234", 5.0, 0.012, 0.2)}
    with pytest.raises(
        ConfigError, match=r"clock.max_sync_uncertainty_s=0.005: decode-0 on node 10.0.0.3/abcd1234"
    ):
        check_uncertainty(offsets, 0.005)
    check_uncertainty(offsets, 0.02)
    assert sync_summary(offsets) == {"10.0.0.3/abcd1234": {"uncertainty_ms": 12.0, "wall_skew_ms": 200.0}}
