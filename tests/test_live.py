"""Live mode on a real multi-node Ray cluster (three nodes on loopback, one per pool resource)."""

import dataclasses
import threading
import time

import pytest
import ray
from ray.cluster_utils import Cluster

from cluster.calibrate import calibrate_on_engine_nodes, resolve_time_scale
from cluster.config_load import ConfigError, load_designs
from cluster.live import run_live
from cluster.virtual import run_virtual
from tests.factories import TRACES

pytestmark = pytest.mark.full  # live Ray clusters: `make test`, not `make test-fast`

NODE = {"node_ip_address": "127.0.0.2", "num_cpus": 1, "object_store_memory": 200 * 1024**2}
GREEDY = [
    "runner.compute=real",
    "workload.output_policy=greedy",
    "workload.num_requests=6",
    "workload.rate=2",
    "workload.prompt_len=300",
    "workload.output_len=12",
]
"""Six short requests, computed for real, greedy: the tokens the live runs across nodes must emit."""
LIVE = ["clock.mode=live", "clock.time_scale=2"]


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(
        initialize_head=True, head_node_args={**NODE, "resources": {"mixed": 2}, "include_dashboard": False}
    )
    c.add_node(**NODE, resources={"prefill": 2})
    c.add_node(**NODE, resources={"decode": 2})
    ray.init(address=c.address, _node_ip_address="127.0.0.2")
    yield c
    ray.shutdown()
    c.shutdown()


def design(name, *overrides):
    return load_designs("guide-l40s", [name], ["metrics.linger_s=0", *overrides])[0]


def collocated_tokens(*overrides):
    """Each request's greedy tokens from one collocated engine in virtual time: the reference the live
    runs across nodes are checked against (in process: the same engine and runner, no actors, no
    waiting)."""
    return tokens(run_virtual(design("collocated", *overrides)))


def tokens(out):
    return out.results["output_token_ids"].map(list).tolist()


@pytest.fixture(scope="module")
def pd_greedy(cluster):
    """A P/D run of GREEDY (KV pulled across the nodes) and the node of each engine: what collocated's
    tokens and push's are checked against (one run for both)."""
    nodes = {}
    pd = run_live(design("pd-fast", *GREEDY, *LIVE), on_deployed=lambda d: nodes.update(d.nodes))
    return pd, nodes


def test_pd_across_nodes_emits_the_collocated_greedy_tokens(pd_greedy):
    pd, nodes = pd_greedy
    assert nodes["prefill-0"] != nodes["decode-0"]
    assert pd.summary["completed"] == 6
    assert tokens(pd) == collocated_tokens(*GREEDY)
    assert (pd.results["kv_bytes"] > 0).all()


def test_pd_across_nodes_with_the_moe_runner_emits_the_collocated_greedy_tokens(cluster):
    """The same check with the tiny Qwen3-MoE runner model (its KV crosses the nodes alike); the tokens
    are not the dense model's, so the actors did load it."""
    moe = (*GREEDY, "runner.architecture=qwen3_moe")
    pd = run_live(design("pd-fast", *moe, *LIVE))
    assert pd.summary["completed"] == 6
    assert tokens(pd) == collocated_tokens(*moe) != collocated_tokens(*GREEDY)


def test_pd_across_nodes_with_the_hybrid_runner_hands_over_the_ssm_state(cluster):
    """A hybrid target (Granite-4.0-H-Tiny: 400-token blocks at TP 1) with the tiny Nemotron-H runner:
    prefill computes each prompt but its last token on one node, its KV and Mamba2 state (as of token
    N-1) cross to decode on another, which computes the last token from it; the greedy tokens are
    collocated's."""
    hybrid = (*GREEDY, "runner.architecture=nemotron_h", "target.model=granite-4.0-h-tiny")
    hybrid += ("scheduler.block_size=400",)  # (the guide's base sets 16)
    pd = run_live(design("pd-fast", *hybrid, *LIVE))
    assert pd.summary["completed"] == 6
    assert tokens(pd) == collocated_tokens(*hybrid)
    assert (pd.results["state_bytes"] == 36 * 806_400).all()


def test_an_expert_parallel_replica_spans_nodes_and_pd_gives_the_collocated_tokens(cluster):
    """Qwen3-30B-A3B with the tiny MoE runner, every pool 2 EP ranks with DP attention: decode's ranks
    of tp 2 (4 'decode' units) take 2 on each of two nodes, its engine in rank 0's; P/D emits
    collocated's greedy tokens. The units are free again after the run."""
    node = cluster.add_node(**NODE, resources={"decode": 2})
    moe = [*GREEDY, "runner.architecture=qwen3_moe", "target.model=qwen3-30b-a3b"]
    for role in ("prefill", "decode", "mixed"):
        moe += [f"pools.{role}.ep=2", f"pools.{role}.dp_attention=true"]
    try:
        ranks: dict[str, list[str]] = {}
        pd = run_live(
            design("pd-fast", *moe, *LIVE, "pools.decode.tp=2"),
            on_deployed=lambda d: ranks.update(d.rank_nodes),
        )
        assert len(ranks["decode-0"]) == 2 and len(set(ranks["decode-0"])) == 2
        assert len(ranks["prefill-0"]) == 2
        assert pd.summary["completed"] == 6
        assert tokens(pd) == collocated_tokens(*moe, "pools.mixed.replicas=1")
        assert ray.available_resources().get("decode") == 4
    finally:
        cluster.remove_node(node)


def test_push_across_nodes_reserves_decode_blocks_first_and_emits_the_pull_tokens(pd_greedy):
    """Decode-first push through the actors (`kv_ready` crosses them): the same greedy tokens as pull."""
    push = run_live(design("pd-fast", *GREEDY, *LIVE, "kv_transfer.mode=push"))
    pull, _ = pd_greedy
    assert push.summary["completed"] == 6
    assert (push.results["kv_blocks_ready_s"] <= push.results["kv_transfer_start_s"]).all()
    assert tokens(push) == tokens(pull)


def test_live_timing_matches_virtual(cluster):
    overrides = [
        "runner.compute=skip",
        "workload.num_requests=8",
        "workload.rate=2",
        "workload.prompt_len=2048",
        "workload.output_len=48",
    ]
    virtual = run_virtual(design("pd-fast", *overrides)).summary
    live = run_live(design("pd-fast", *overrides, "clock.mode=live")).summary
    assert live["completed"] == 8 and live["lag_fraction"] < 0.05
    # Every node's clock offset to the head's, known to within half a round trip (well under the bound).
    assert len(live["clock_sync"]) >= 2  # (prefill and decode nodes; the proxy is on one of the three)
    assert all(0 < n["uncertainty_ms"] < 5 for n in live["clock_sync"].values())
    assert live["median_ttft_ms"] == pytest.approx(virtual["median_ttft_ms"], rel=0.05)
    assert live["median_itl_ms"] == pytest.approx(virtual["median_itl_ms"], rel=0.05)
    # The render tier's cost model puts the same time on both paths (2,048 tokens: about 2.7 ms).
    assert live["median_render_ms"] == virtual["median_render_ms"] > 2.0


def test_a_shared_fabric_queues_live_transfers_as_in_virtual_time(cluster):
    """Two prefill and two decode engines on one fabric (the link's actor), a burst of 8k prompts: pulls
    from both prefill engines queue on it, one wire at a time, as in virtual mode. (Arrivals 1 ms apart
    may meet a prefill step boundary differently live, so the starts may differ by about that much.)"""
    overrides = [
        "runner.compute=skip",
        "pools.prefill.replicas=2",
        "pools.decode.replicas=2",
        "kv_transfer.link=pcie4-x16",
        "kv_transfer.link_scope=fabric",
        "workload.num_requests=4",
        "workload.rate=1000",
        "workload.output_len=8",
    ]
    virtual = run_virtual(design("pd-fast", *overrides)).results
    live = run_live(design("pd-fast", *overrides, "clock.mode=live")).results
    for df in (virtual, live):
        assert (df["handoff_link_queue_s"] > 0).any()  # the burst contends on the fabric
        wires = df.sort_values("kv_wire_start_s")
        ends = wires["kv_wire_start_s"] + wires["kv_wire_s"]
        assert (wires["kv_wire_start_s"].to_numpy()[1:] >= ends.to_numpy()[:-1] - 1e-9).all()  # one wire
    assert sorted(live["kv_wire_start_s"]) == pytest.approx(sorted(virtual["kv_wire_start_s"]), abs=5e-3)


def test_lag_is_counted_when_the_host_cannot_keep_up(cluster):
    cfg = design("collocated", *GREEDY, "clock.mode=live", "clock.time_scale=0.02", "workload.num_requests=3")
    out = run_live(cfg)
    assert out.summary["completed"] == 3
    assert out.summary["lag_fraction"] > 0.5 and out.summary["max_overrun_ms"] > 0


LOSING_AN_ENGINE = (
    "pd-fast",
    "runner.compute=skip",
    "workload.num_requests=12",
    "workload.rate=3",
    "workload.prompt_len=2048",
    "clock.mode=live",
)
"""A P/D run that loses an engine a second or two in, with requests in flight everywhere."""


@pytest.mark.parametrize("victim", ["decode-0", "prefill-0"])
def test_killing_an_engine_fails_its_requests_and_the_run_completes(cluster, victim):
    cfg = design(*LOSING_AN_ENGINE, "workload.output_len=120")

    def kill_later(dep):
        threading.Timer(2.0, ray.kill, args=(dep.engines[victim],)).start()

    start = time.monotonic()
    out = run_live(cfg, on_deployed=kill_later)
    assert time.monotonic() - start < 120
    df = out.results
    assert len(df) == 12  # nothing dropped
    failed = df[~df["ok"]]
    assert len(failed) >= 1 and set(failed["finished_reason"]) <= {"error", "abort"}
    assert failed["error"].notna().all()
    assert out.engine_reports[victim].error is not None
    assert out.summary["num_engines_lost"] == 1


def test_an_engine_kill_injected_by_config_kills_the_actor_and_its_prefills_are_retried(cluster):
    """`faults.engine_kills` in live mode: the prefill actor dies at its emulated time; its requests
    go to the other prefill engine (or, pulled from it too late, are computed on decode), none lost."""
    cfg = design(
        *LOSING_AN_ENGINE,
        "workload.output_len=60",
        "pools.prefill.replicas=2",
        "kv_transfer.load_failure_policy=recompute",
        "faults.engine_kills=[{engine: prefill-0, at_s: 1.5}]",
    )
    out = run_live(cfg)
    df = out.results
    assert len(df) == 12 and df["ok"].all(), df.loc[~df["ok"], "error"].tolist()
    assert out.summary["num_engines_lost"] == 1 and out.engine_reports["prefill-0"].error is not None
    assert (df.loc[df["arrival_s"] > 3.0, "prefill_engine"] == "prefill-1").all()


def test_a_hung_prefill_actor_is_given_up_on_and_its_requests_are_served_by_the_other(cluster):
    """`faults.engine_hangs` in live mode: the prefill actor's step loop stops (no error); the proxy
    gives up on each request there after router.prefill_timeout_s and retries it on prefill-1."""
    cfg = design(
        *LOSING_AN_ENGINE,
        "workload.output_len=60",
        "pools.prefill.replicas=2",
        "faults.engine_hangs=[{engine: prefill-0, at_s: 1.0}]",
        "router.prefill_timeout_s=1.5",
    )
    out = run_live(cfg)  # the hung engine drains empty: its requests were aborted there
    df = out.results
    assert len(df) == 12 and df["ok"].all(), df.loc[~df["ok"], "error"].tolist()
    assert out.summary["num_engines_hung"] == 1 and out.summary["num_prefill_timeouts"] > 0
    assert (df.loc[df["num_prefill_timeouts"] > 0, "prefill_engine"] == "prefill-1").all()


def test_a_killed_proxy_actor_fails_its_requests_in_flight_and_ray_brings_it_back(cluster):
    """`faults.proxy_kills` in live mode: the proxy actor is killed at 1.5 s; the requests it was serving
    fail with the reason (not lost), Ray restarts it, the driver rejoins it to the run's clock, and the
    requests sent later are served by it; the engines drain empty."""
    cfg = design(*LOSING_AN_ENGINE, "workload.output_len=60", "faults.proxy_kills=[1.5]")
    out = run_live(cfg)
    df = out.results
    assert len(df) == 12 and df["request_id"].is_unique and out.summary["num_proxy_restarts"] == 1
    failed = df[~df["ok"]]
    assert len(failed) > 0 and failed["error"].str.contains("the proxy died").all()
    # (the driver sends each request 50 ms ahead of its arrival: one arriving just after may be in flight)
    assert (failed["arrival_s"] <= 1.6).all() and df.loc[df["arrival_s"] > 2.0, "ok"].all()


def test_a_clock_offset_known_worse_than_the_bound_is_refused(cluster):
    cfg = design("collocated", "runner.compute=skip", "clock.mode=live", "clock.max_sync_uncertainty_s=1e-9")
    with pytest.raises(ConfigError, match=r"clock.max_sync_uncertainty_s=1e-09: .* on node 127.0.0.2/"):
        run_live(cfg)
    deadline = time.monotonic() + 20  # the actors it made are killed: their resources come back
    while ray.available_resources().get("mixed", 0) < 2:
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.2)


def test_a_pool_larger_than_the_cluster_offers_is_a_clear_error(cluster):
    cfg = design("collocated", "pools.mixed.replicas=3", "clock.mode=live")
    with pytest.raises(
        ConfigError, match=r"pools.mixed: 3 replica\(s\) x tp=1 need 1 'mixed' resource units"
    ):
        run_live(cfg)


def test_auto_time_scale_joining_a_cluster_is_calibrated_on_the_engines_nodes_not_the_drivers(cluster):
    cfg = design("pd-fast", "runner.compute=real", "clock.mode=live", "clock.time_scale=auto")
    scale, per_node = calibrate_on_engine_nodes(cfg)
    offers = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    assert {tuple(sorted({"prefill", "decode"} & set(offers[n]))) for n in per_node} == {
        ("prefill",),
        ("decode",),
    }  # the head (mixed only: no engine of pd-fast) measured nothing
    assert scale == max(p["scale"] for p in per_node.values()) >= 1.0
    assert {"prefill chunk", "kv handoff"} <= set(next(iter(per_node.values()))["probes"])
    resolved = resolve_time_scale(cfg, cluster.address)
    assert isinstance(resolved.clock.time_scale, float) and ray.is_initialized()  # the cluster is kept


MOONCAKE = str(TRACES / "mooncake_fast25" / "conversation_trace.window_0s_1200s.jsonl")


def test_a_mooncake_window_replays_live_as_in_virtual_time(cluster):
    """The trace's first 15 s on two engines with KV-aware routing (events cross actors on the output
    batches): every request completes, lag stays under 1 %, and the cache reuse is virtual mode's.
    (TTFT is not: Mooncake stamps arrivals in ~3 s buckets, and requests of one stamp reach the proxy
    actor in whatever order Ray delivers them, so engines see another order than in virtual time.)"""
    overrides = [
        "runner.compute=skip",
        "workload.kind=trace",
        f"replay.trace={MOONCAKE}",
        "replay.window_s=[0,15]",
        "router.policy=kv_aware",
        "pools.mixed.replicas=2",
        "metrics.linger_s=0",
    ]
    cfg = load_designs("agentic-h200", ["collocated"], overrides)[0]
    virtual = run_virtual(cfg)
    # At the scale `auto` gives this config (1.15: the step's bookkeeping and wake-up allowance against the
    # shortest decode step); at the preset's 1, a full suite's run once lagged 1.04 % of steps.
    live_cfg = resolve_time_scale(
        dataclasses.replace(cfg, clock=dataclasses.replace(cfg.clock, mode="live", time_scale="auto"))
    )
    live = run_live(live_cfg)
    assert live.summary["completed"] == virtual.summary["completed"] == len(live.results) > 30
    assert live.summary["lag_fraction"] < 0.01
    assert live.summary["prefix_hit_rate"] == pytest.approx(virtual.summary["prefix_hit_rate"], abs=0.02)
    assert live.results["ok"].all()


def test_bidirectional_pulls_back_across_nodes(cluster):
    """Real compute, three short turns of one conversation: prefill pulls each answer's KV back from
    the decode node (real tensors across actors) and computes only the new message, as in virtual
    time. (Greedy numerics with pulled-back KV are checked in tests/test_bidirectional.py.)"""
    overrides = [
        "runner.compute=real",
        "workload.kind=multi_turn",
        "multi_turn.num_conversations=1",
        "multi_turn.num_turns=constant:3",
        "multi_turn.common_prefix_tokens=0",
        "multi_turn.prefix_tokens=constant:200",
        "multi_turn.user_tokens=constant:40",
        "multi_turn.output_tokens=constant:48",
        "multi_turn.think_s=constant:0.2",
        *LIVE,
    ]
    cfg = design("pd-fast", *overrides, "kv_transfer.bidirectional=true")
    live = run_live(cfg).results
    virtual = run_virtual(
        dataclasses.replace(cfg, clock=dataclasses.replace(cfg.clock, mode="virtual"))
    ).results
    assert live["ok"].all() and (live["prefill_pulled_back_tokens"].iloc[1:] > 0).all()
    assert live["prompt_computed_tokens"].tolist() == virtual["prompt_computed_tokens"].tolist()


def test_a_conversation_whose_decode_engine_died_completes_with_recompute(cluster):
    """Two decode engines, one conversation: its decode engine is killed after turn 1. Turn 2's pull
    back finds nothing (prefill recomputes, and the results say so) and another decode engine takes
    the turn; the run completes."""
    overrides = [
        "runner.compute=skip",
        "pools.decode.replicas=2",
        "kv_transfer.bidirectional=true",
        "workload.kind=multi_turn",
        "multi_turn.num_conversations=1",
        "multi_turn.num_turns=constant:3",
        "multi_turn.common_prefix_tokens=0",
        "multi_turn.prefix_tokens=constant:1000",
        "multi_turn.user_tokens=constant:100",
        "multi_turn.output_tokens=constant:40",
        "multi_turn.think_s=constant:1",
        "clock.mode=live",
    ]
    handles = {}
    killed = []

    def kill_after_first(result):
        if result.turn == 0 and not killed:
            killed.append(result.engine)
            ray.kill(handles[result.engine])

    out = run_live(
        design("pd-fast", *overrides),
        on_result=kill_after_first,
        on_deployed=lambda d: handles.update(d.engines),
    )
    df = out.results
    assert df["ok"].all() and len(df) == 3
    assert bool(df["prefill_kv_pull_back_failed"].iloc[1]) and df["engine"].iloc[1] != killed[0]
    assert df["prefill_pulled_back_tokens"].iloc[2] > 0  # turn 3 pulls back from the new decode engine
    assert out.summary["num_engines_lost"] == 1


def test_e_p_d_across_nodes_emits_the_tokens_of_an_engine_encoding_locally(cluster):
    """An encoder actor encodes each request's image for real, the proxy actor moves the embeddings to
    the prefill actor, decode gets the KV: the greedy tokens of one engine encoding in its own steps."""
    images = ["target.model=qwen2.5-vl-7b", "workload.images_per_request=constant:1",
              "workload.image_tokens=16", "workload.num_requests=4", "workload.prompt_len=100",
              "workload.output_len=8", "workload.rate=2", "runner.compute=real",
              "workload.output_policy=greedy"]  # fmt: skip
    live = run_live(design("pd-fast", *images, *LIVE, "pools.encoder.replicas=1"))
    local = run_virtual(design("collocated", *images))
    assert live.summary["completed"] == local.summary["completed"] == 4
    assert tokens(live) == tokens(local)
    assert (live.results["encode_s"] > 0).all() and (local.results["encode_s"] == 0).all()


def test_the_shared_kv_store_is_an_actor_every_engine_loads_from(cluster):
    """Real compute, three two-turn chats on two engines taking turns, KV offloaded to the shared
    store only: each second turn lands on the engine that did not compute the first, which loads
    the history from the store's actor (numpy through Ray); greedy tokens are virtual mode's."""
    overrides = [
        "runner.compute=real",
        "workload.output_policy=greedy",
        "workload.kind=multi_turn",
        "multi_turn.num_conversations=3",
        "multi_turn.num_turns=constant:2",
        "multi_turn.common_prefix_tokens=0",
        "multi_turn.prefix_tokens=constant:300",
        "multi_turn.user_tokens=constant:40",
        "multi_turn.output_tokens=constant:16",
        "multi_turn.think_s=constant:1",
        "multi_turn.conversation_rate=20",
        "multi_turn.history=model",
        "pools.mixed.replicas=2",
        "router.policy=round_robin",
        "kv_offload.shared_gb=8",
        "kv_offload.shared_link=rdma-400g",
        *LIVE,
    ]
    cfg = design("collocated", *overrides)
    live = run_live(cfg).results
    virtual = run_virtual(
        dataclasses.replace(cfg, clock=dataclasses.replace(cfg.clock, mode="virtual"))
    ).results
    assert live["ok"].all() and len(live) == 6
    second = live[live["turn"] == 1]
    assert (second["num_shared_tokens"] > 0).all()
    by_id = lambda df: dict(zip(df["request_id"], df["output_token_ids"].map(list), strict=True))  # noqa: E731
    assert by_id(live) == by_id(virtual)
