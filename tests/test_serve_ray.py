"""`testbed serve --ray`: the same HTTP server in front of Ray actors (render pool, proxy, engines), as a
live run deploys them on a local Ray."""

import itertools
import json
import statistics
import time

import httpx
import openai
import pytest
import ray

from dashboards.exposition import sum_series
from tests.factories import ServeThread
from tests.test_serve import ASK, MODEL, WEATHER


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sd_file = tmp_path_factory.mktemp("sd") / "targets.json"
    s = ServeThread(f"metrics.sd_file={sd_file}", "render.replicas=2", on_ray=True)
    s.sd_file = sd_file
    yield s
    if s.thread.is_alive():
        s.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _render_calls(server, op):
    text = httpx.get(f"{server.url}/metrics").text
    return [sum_series([text], "testbed:render_calls_total", op=op, replica=str(i)) for i in range(2)]


def test_roles_are_ray_actors_announced_for_prometheus(server):
    dep = server.served.deployment
    assert len(dep.renders) == 2 and set(dep.engines) == {"prefill-0", "decode-0"}
    assert not server.served.engines  # nothing computes in the server's process
    actors = {g["labels"]["actor"] for g in json.loads(server.sd_file.read_text())}
    assert actors == {"proxy", "prefill-0", "decode-0", "render-0", "render-1"}


def test_chat_streams_reasoning_and_a_tool_call_through_the_actors(server, client):
    whole = client.chat.completions.create(model=MODEL, messages=ASK, tools=WEATHER, max_tokens=200)
    (call,) = whole.choices[0].message.tool_calls
    assert (
        json.loads(call.function.arguments) == {"city": "Paris"}
        and whole.choices[0].message.reasoning_content
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=WEATHER,
            max_tokens=200,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    reasoning = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices
    )
    assert reasoning == whole.choices[0].message.reasoning_content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_a_client_sees_tokens_paced_as_emulated_not_in_actor_batches(server, client):
    """Engine actors stream batches; behind `serve --ray` they flush every 10 ms wall (not a run's 50
    ms), so a client's inter-token gaps follow the emulated ITL (24 ms here) instead of 50 ms bursts."""
    gaps = []
    for i in range(3):
        messages = [{"role": "user", "content": f"pace {i}"}]
        times = [
            time.monotonic()
            for c in client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=30, stream=True
            )
            if c.choices
            and (c.choices[0].delta.content or getattr(c.choices[0].delta, "reasoning_content", None))
        ]
        gaps += [b - a for a, b in itertools.pairwise(times)]
    emulated = [
        b - a for r in server.served.frontend.results[-3:] for a, b in itertools.pairwise(r.token_times_s)
    ]
    assert statistics.median(gaps) == pytest.approx(statistics.median(emulated), rel=0.25)
    assert sorted(gaps)[len(gaps) // 4] > 0.5 * statistics.median(
        emulated
    )  # no bursts of back-to-back tokens


def test_both_render_replicas_render_and_decode_renders_again_for_non_text_content(server, client):
    before = sum(_render_calls(server, "render"))
    for _ in range(4):
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=3)
    calls = _render_calls(server, "render")
    assert sum(calls) - before == 4 and min(calls) > 0  # round robin over the two actors
    image = [{"role": "user", "content": [{"type": "text", "text": "what is this"}, {"type": "image_url"}]}]
    client.chat.completions.create(model=MODEL, messages=image, max_tokens=3)
    assert (
        sum(_render_calls(server, "render")) - sum(calls) == 2
    )  # the front end's, and the proxy's for decode


def test_a_client_leaving_mid_stream_aborts_in_the_actors(server):
    before = len(server.served.frontend.results)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "long"}],
        "max_tokens": 400,
        "stream": True,
    }
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as s:
        lines = s.iter_lines()
        for _ in range(6):
            next(lines)
    deadline = time.monotonic() + 10
    while len(server.served.frontend.results) == before:
        assert time.monotonic() < deadline, "the abandoned request never ended"
        time.sleep(0.1)
    assert server.served.frontend.results[-1].finished_reason == "abort"
    dep = server.served.deployment
    while any(ray.get(h.report.remote())["num_unfinished_requests"] for h in dep.engines.values()):
        assert time.monotonic() < deadline, "the engines still run the abandoned request"
        time.sleep(0.1)


def test_stop_drains_every_actor_empty_and_stops_ray(server):
    n = len(server.served.frontend.results)
    assert n >= 8
    server.stop()  # raises if an engine or a render replica was left with a request or a stream
    assert not ray.is_initialized()
