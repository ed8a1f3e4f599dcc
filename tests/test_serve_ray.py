"""`testbed serve --ray`: the same HTTP server in front of Ray actors (render pool, proxy, engines), as a
live run deploys them on a local Ray."""

import itertools
import json
import statistics
import time

import openai
import pytest
import ray

from tests.factories import ServeThread
from tests.test_serve import (  # the in-process server's API tests, run again against the actors
    ASK,
    IMAGE,
    MODEL,
    VL,
    num_render_calls,
    test_bad_input_gets_an_openai_shaped_error,  # noqa: F401
    test_chat_returns_reasoning_a_tool_call_and_usage,  # noqa: F401
    test_completions_streamed_and_not_with_echo,  # noqa: F401
    test_generate_returns_the_exact_token_ids_and_derender_reads_them,  # noqa: F401
    test_images_become_visual_tokens_and_bad_ones_are_400s_naming_the_part,  # noqa: F401
    test_models_health_and_metrics_on_the_same_port,  # noqa: F401
    test_nothing_leaves_before_the_first_token,  # noqa: F401
    test_prompt_token_ids_a_pd_proxy_sends_are_used_without_rendering,  # noqa: F401
    test_streamed_chat_adds_up_to_the_same_answer,  # noqa: F401
)

pytestmark = pytest.mark.full  # testbed serve on Ray: `make test`, not `make test-fast`


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sd_file = tmp_path_factory.mktemp("sd") / "targets.json"
    s = ServeThread(f"metrics.sd_file={sd_file}", "render.replicas=2", *VL, on_ray=True)
    s.sd_file = sd_file
    yield s
    if s.thread.is_alive():
        s.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _render_calls(server, op):
    """Per replica."""
    return [num_render_calls(server, op, replica=str(i)) for i in range(2)]


def test_roles_are_ray_actors_announced_for_prometheus(server):
    dep = server.served.deployment
    assert len(dep.renders) == 2 and set(dep.engines) == {"prefill-0", "decode-0"}
    assert not server.served.engines  # nothing computes in the server's process
    actors = {g["labels"]["actor"] for g in json.loads(server.sd_file.read_text())}
    assert actors == {"proxy", "prefill-0", "decode-0", "render-0", "render-1"}


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
            if c.choices and (c.choices[0].delta.content or getattr(c.choices[0].delta, "reasoning", None))
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
    image = [{"role": "user", "content": [{"type": "text", "text": "what is this"}, IMAGE]}]
    client.chat.completions.create(model=MODEL, messages=image, max_tokens=3)
    assert (
        sum(_render_calls(server, "render")) - sum(calls) == 2
    )  # the front end's, and the proxy's for decode


def test_a_client_leaving_mid_stream_aborts_in_the_actors(server):
    engines = server.served.deployment.engines.values()

    def idle():
        return not any(ray.get(h.report.remote()).num_unfinished_requests for h in engines)

    assert server.leave_mid_stream(idle).finished_reason == "abort"


def test_stop_drains_every_actor_empty_and_stops_ray(server):
    n = len(server.served.frontend.results)
    assert n >= 8
    server.stop()  # raises if an engine or a render replica was left with a request or a stream
    assert not ray.is_initialized()
