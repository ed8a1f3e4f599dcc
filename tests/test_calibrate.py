"""time_scale: auto picks a scale at which every probe step's real work fits its emulated budget."""

import pytest

from cluster.calibrate import HEADROOM, MIN_AUTO_SCALE, WAKE_ALLOWANCE_WALL_S, calibrate, resolve_time_scale
from cluster.config_load import load_designs


def design(*overrides):
    return load_designs("guide-l40s", ["collocated"], list(overrides))[0]


def test_every_probe_fits_at_the_chosen_scale():
    for compute in ("skip", "real"):
        scale, probes = calibrate(design(f"runner.compute={compute}", "workload.prompt_len=2048"))
        for p in probes.values():
            wall_budget_ms = p["emulated_ms"] * scale
            assert wall_budget_ms >= (p["real_ms"] + WAKE_ALLOWANCE_WALL_S * 1e3) * HEADROOM - 1e-6


def test_real_compute_needs_more_time_than_skip_and_auto_never_runs_faster_than_real_time():
    skip, skip_probes = calibrate(design("runner.compute=skip", "workload.prompt_len=4096"))
    real, real_probes = calibrate(design("runner.compute=real", "workload.prompt_len=4096"))
    assert max(p["scale"] for p in real_probes.values()) > max(p["scale"] for p in skip_probes.values())
    assert real >= skip == MIN_AUTO_SCALE


def test_auto_is_resolved_and_explicit_scales_are_kept():
    auto = resolve_time_scale(design("runner.compute=skip", "clock.mode=live", "clock.time_scale=auto"))
    assert isinstance(auto.clock.time_scale, float) and auto.clock.time_scale > 0
    fixed = design("clock.mode=live", "clock.time_scale=3")
    assert resolve_time_scale(fixed) is fixed
    with pytest.raises(ValueError, match="auto"):
        _ = design("clock.time_scale=auto").clock.scale
