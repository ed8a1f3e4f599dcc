"""A real Prometheus scrapes a live run; every shipped dashboard expression, and vLLM's stock dashboard
queries, must return data through its HTTP API, and its TTFT histogram must match the results table."""

import asyncio
import json
import math
import shutil
import socket
import time
import urllib.parse
import urllib.request
from pathlib import Path

import openai
import pytest

from cluster.config_load import load_designs
from cluster.live import deploy, drive, shutdown
from cluster.outcome import run_output
from cluster.ray_connect import connect, disconnect
from dashboards import grafana
from dashboards import metrics as m
from dashboards.stack import down, up
from tests.factories import ServeThread
from tests.test_serve import IMAGE, VL
from workloads.replay import workload_for

pytestmark = pytest.mark.full  # a real Prometheus scraping live runs: `make test`, not `make test-fast`

MODEL = "qwen2.5-7b"
MOE = (  # served under the same name: the boards select one model_name
    "target.model=qwen3-30b-a3b",
    "target.time_model=operators",
    f"target.served_model_name={MODEL}",
    *(f"pools.prefill.{setting}" for setting in ("ep=2", "dp_attention=true", "enable_dbo=true")),
    *(f"pools.decode.afd.{setting}" for setting in ("num_attention_ranks=2", "ffn_ep=2", "link=rdma-400g")),
)  # fmt: skip
# vLLM's stock Grafana dashboard (examples/online_serving/prometheus_grafana) queries, in its own shape:
# exact `model_name` match, `sum by(le)` quantiles, per-engine rates.
SEL = '{model_name="$model_name"}[$__rate_interval]'
STOCK_VLLM_QUERIES = [
    *[
        f"histogram_quantile({q}, sum by(le) (rate(vllm:{name}_bucket{SEL})))"
        for name in (
            "time_to_first_token_seconds",
            "inter_token_latency_seconds",
            "e2e_request_latency_seconds",
            "request_time_per_output_token_seconds",
            "nixl_xfer_time_seconds",
            "request_prompt_tokens",
        )
        for q in (0.5, 0.99)
    ],
    'rate(vllm:e2e_request_latency_seconds_sum{model_name="$model_name"}[$__rate_interval])\n/\n'
    'rate(vllm:e2e_request_latency_seconds_count{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:prompt_tokens_total{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:generation_tokens_total{model_name="$model_name"}[$__rate_interval])',
    'vllm:num_requests_running{model_name="$model_name"}',
    'vllm:num_requests_waiting{model_name="$model_name"}',
    'vllm:kv_cache_usage_perc{model_name="$model_name"}',
    'rate(vllm:prefix_cache_hits_total{model_name="$model_name"}[$__rate_interval]) / '
    'rate(vllm:prefix_cache_queries_total{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:nixl_bytes_transferred_sum{model_name="$model_name"}[$__rate_interval])',
]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(url, expr):
    qs = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{qs}", timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def _values(url, expr):
    return [float(s["value"][1]) for s in _query(url, expr)]


def _substitute(expr):
    return (
        expr.replace("$__rate_interval", "1m")
        .replace("$model_name", MODEL)
        .replace("$design", ".*")
        .replace("$role", ".*")
    )


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """A live P/D run and a `testbed serve` (the render tier's series come from it), scraped every second
    by a real Prometheus; yields its URL and the run's output while the actors still serve their final
    values."""
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus is not installed: `make test` installs it (apt-get install prometheus)")
    tmp = tmp_path_factory.mktemp("prometheus")
    sd_file = str(tmp / "targets.json")
    stack = up(
        port=_free_port(), grafana_port=_free_port(), scrape_interval="1s", sd_file=sd_file, state_dir=tmp
    )
    cfg = load_designs(
        "guide-l40s",
        ["pd-fast"],
        [
            "clock.mode=live",
            "runner.compute=skip",
            # sessions, so that the sessions board has its data; KV events cross actors
            "workload.kind=multi_turn",
            "multi_turn.num_conversations=4",
            "multi_turn.num_turns=constant:4",
            "multi_turn.common_prefix_tokens=256",
            "multi_turn.prefix_tokens=constant:1500",
            "multi_turn.user_tokens=constant:200",
            "multi_turn.output_tokens=constant:32",
            "multi_turn.think_s=constant:0.5",
            "multi_turn.conversation_rate=1",
            "router.policy=kv_aware",
            f"metrics.sd_file={sd_file}",
        ],
    )[0]
    # E+PD behind the server, so that the encoder row has its data; a MoE target behind another, prefill
    # with expert parallelism, DP attention and dual-batch overlap, decode attention-FFN disaggregated, so
    # that the MoE row has its
    served = ServeThread(*VL, "pools.encoder.replicas=1")
    moe_served = ServeThread(*MOE)
    started = connect([cfg], None)
    try:
        dep = deploy(cfg)
        groups = json.loads(Path(sd_file).read_text())
        for name, server in (("serve", served), ("serve-moe", moe_served)):
            target = server.url.removeprefix("http://")
            groups.append({"targets": [target], "labels": {"design": name, "actor": name}})
        Path(sd_file).write_text(json.dumps(groups))
        results = asyncio.run(drive(dep, cfg, workload_for(cfg)))
        chat = openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0)
        image = [{"type": "text", "text": "What is this?"}, IMAGE]
        for content in ("What is the weather in Paris?", "Hello there", image, image):  # after a scrape
            chat.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=8
            )
        moe_chat = openai.OpenAI(base_url=f"{moe_served.url}/v1", api_key="unused", max_retries=0)
        for words in (1200, 1300):  # over 512 prompt tokens a rank: the prefill steps split in two
            content = " ".join(["expert"] * words)
            moe_chat.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=8
            )
        deadline = time.monotonic() + 30
        finished = f'sum({m.REQUESTS_FINISHED.exposed}{{design="pd-fast"}})'
        while sum(_values(stack.prometheus_url, finished)) < len(results):
            assert time.monotonic() < deadline, "Prometheus never scraped the final counts"
            time.sleep(0.5)
        time.sleep(2.5)  # two more scrapes: every actor's last values are in
        yield stack.prometheus_url, results, dep, cfg
        reports, _, _ = shutdown(dep, cfg)
        for eid, report in reports.items():
            assert report.error is None, eid
    finally:
        served.stop()
        moe_served.stop()
        if started:
            disconnect()
        down(tmp)


def test_prometheus_scrapes_every_actor(scraped):
    url, _, dep, _ = scraped
    up_targets = _query(url, 'up{job="disagg-testbed"}')
    assert {t["metric"]["actor"] for t in up_targets} == {*dep.metrics_targets, "serve", "serve-moe"}
    assert all(t["value"][1] == "1" for t in up_targets)
    # llm-d's boards select by the labels Kubernetes scraping adds: namespace and pod
    decode = _query(url, 'up{job="disagg-testbed", pod=~".*decode.*"}')
    assert {t["metric"]["pod"] for t in decode} == {a for a in dep.metrics_targets if "decode" in a}
    assert {t["metric"]["namespace"] for t in decode} == {"pd-fast"}


@pytest.mark.parametrize("board", list(grafana.BOARDS))
def test_every_dashboard_expression_returns_data(scraped, board):
    url = scraped[0]
    exprs = grafana.expressions((grafana.OUT_DIR / f"{board}.json").read_text())
    assert len(exprs) >= 8
    empty = []
    for expr in exprs:
        if expr.startswith("label_values("):  # a Grafana variable: the label must have values
            metric, label = expr[len("label_values(") : -1].split(", ")
            values = {s["metric"].get(label) for s in _query(url, metric)}
            if not values - {None}:
                empty.append(expr)
            continue
        if not [v for v in _values(url, _substitute(expr)) if not math.isnan(v)]:
            empty.append(expr)
    assert not empty, "no data:\n" + "\n".join(empty)


def test_vllm_stock_dashboard_queries_return_data(scraped):
    url = scraped[0]
    empty = [
        q for q in STOCK_VLLM_QUERIES if not [v for v in _values(url, _substitute(q)) if not math.isnan(v)]
    ]
    assert not empty, "no data:\n" + "\n".join(empty)


def test_ttft_in_prometheus_matches_the_results_table(scraped):
    url, results, _, cfg = scraped
    df = run_output(cfg, results, {}, {}).results
    count = sum(_values(url, f'sum({m.CLIENT_TTFT.count}{{design="pd-fast"}})'))
    total = sum(_values(url, f'sum({m.CLIENT_TTFT.sum}{{design="pd-fast"}})'))
    assert count == len(df) == df["ttft_s"].notna().sum()
    assert math.isclose(total, df["ttft_s"].sum(), rel_tol=1e-9)
    assert (
        sum(_values(url, f"sum({m.GENERATION_TOKENS.exposed}{{role='decode', design='pd-fast'}})"))
        == df["num_output_tokens"].sum()
    )


def test_dashboards_up_and_down_from_the_command_line(tmp_path, monkeypatch, capsys):
    from cluster.cli import main

    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path))
    port = _free_port()
    assert main(["dashboards", "up", "--port", str(port), "--grafana-port", str(_free_port())]) == 0
    try:
        out = capsys.readouterr().out
        assert f"Prometheus: http://127.0.0.1:{port}" in out
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5) as r:
            assert r.status == 200
        assert main(["dashboards", "up"]) == 0  # already running: reported, not started twice
        assert f"http://127.0.0.1:{port}" in capsys.readouterr().out
    finally:
        assert main(["dashboards", "down"]) == 0
    assert "prometheus" in capsys.readouterr().out
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2)
