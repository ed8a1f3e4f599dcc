"""Attention-FFN disaggregation live: the engine (attention) on one node, its FFN rank actors on another
(the `ffn` resource), every MoE layer's hidden states crossing through Ray; the greedy tokens are those
of the same target without AFD, and the real work keeps up with the emulated steps."""

import time

import pytest
import ray
from ray.cluster_utils import Cluster

from cluster.config_load import load_designs
from cluster.live import run_live
from cluster.virtual import run_virtual

pytestmark = pytest.mark.full  # a live Ray cluster: `make test`, not `make test-fast`

NODE = {"node_ip_address": "127.0.0.2", "num_cpus": 1, "object_store_memory": 200 * 1024**2}
TIME_SCALE = 10
"""Wall seconds per emulated second. Qwen3-30B-A3B's decode steps on an H100 are ~5 ms emulated here; on a
2-core host the tiny runner's step is ~10 ms and each of its 2 layers' crossings to the FFN actors
~3-5 ms more (`bench/afd_crossing.py`), with the proxy, driver and actors sharing the cores: at 6 no step
lagged, at 4 too many did."""
MOE = [
    "metrics.linger_s=0",
    "runner.compute=real",
    "runner.architecture=qwen3_moe",
    "workload.output_policy=greedy",
    "workload.num_requests=6",
    "workload.rate=6",
    "workload.prompt_len=300",
    "workload.output_len=12",
    "target.model=qwen3-30b-a3b",
    "target.time_model=operators",
    "pools.mixed.replicas=1",
    "pools.mixed.gpu=h100-sxm",
]
AFD = [
    "pools.mixed.afd.num_attention_ranks=4",
    "pools.mixed.afd.num_ffn_ranks=2",
    "pools.mixed.afd.link=rdma-400g",
    "clock.mode=live",
    f"clock.time_scale={TIME_SCALE}",
]


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(
        initialize_head=True, head_node_args={**NODE, "resources": {"mixed": 8}, "include_dashboard": False}
    )
    c.add_node(**NODE, resources={"ffn": 2})
    ray.init(address=c.address, _node_ip_address="127.0.0.2")
    yield c
    ray.shutdown()
    c.shutdown()


def test_afd_ffn_actors_on_their_own_node_give_the_collocated_tokens_without_lag(cluster):
    placed = {}

    def where(dep):
        placed["engine"] = dep.nodes["mixed-0"]
        placed["ffn"] = ray.get([h.node_id.remote() for h in dep.ffn["mixed-0"]])

    afd = run_live(load_designs("guide-l40s", ["collocated"], [*MOE, *AFD])[0], on_deployed=where)
    assert len(placed["ffn"]) == 2 and placed["engine"] not in placed["ffn"]
    ffn_node = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("ffn"))
    assert set(placed["ffn"]) == {ffn_node}
    deadline = time.monotonic() + 20  # the actors are killed with the run: their units come back
    while ray.available_resources().get("ffn", 0) < 2:
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.2)
    colo = run_virtual(load_designs("guide-l40s", ["collocated"], MOE)[0])
    assert afd.summary["completed"] == colo.summary["completed"] == 6
    assert (
        afd.results["output_token_ids"].map(list).tolist()
        == colo.results["output_token_ids"].map(list).tolist()
    )
    assert afd.summary["lag_fraction"] < 0.01, afd.summary["max_overrun_ms"]
