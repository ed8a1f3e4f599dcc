"""Live placement of tensor-parallel engines: one unit of the pool's resource per emulated GPU, all on one
node (a local Ray of its own: started here with 8 units, then with 7)."""

import logging

import pytest
import ray

from cluster.config_load import ConfigError, load_designs
from cluster.live import run_live

pytestmark = pytest.mark.full  # live Ray clusters: `make test`, not `make test-fast`

TP8 = [
    "pools.mixed.replicas=1", "pools.mixed.tp=8", "pools.mixed.gpu=h100-sxm", "target.model=llama-3.1-70b",
    "runner.compute=skip",
    "workload.num_requests=3", "workload.prompt_len=200", "workload.output_len=4", "workload.rate=4",
    "clock.mode=live", "metrics.linger_s=0",
]  # fmt: skip


def tp8():
    return load_designs("guide-l40s", ["collocated"], TP8)[0]


def test_a_tp8_engine_places_on_8_units_of_its_pool():
    """A local Ray started for the run offers what the pools need (replicas x tp); the engine's
    emulated step is the TP-8 Llama-3.1-70B's."""
    out = run_live(tp8())
    assert out.summary["completed"] == 3 and not ray.is_initialized()


def test_a_tp8_engine_on_7_units_fails_in_one_line_naming_pool_resource_and_count():
    ray.init(num_cpus=2, resources={"mixed": 7}, include_dashboard=False, logging_level=logging.WARNING)
    try:
        with pytest.raises(ConfigError) as e:
            run_live(tp8())
        message = str(e.value)
        assert "\n" not in message and message.startswith("pools.mixed: 1 replica(s) x tp=8 need 8 'mixed'")
        assert "offer 7 in all" in message
    finally:
        ray.shutdown()
