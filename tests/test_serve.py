"""`testbed serve`: the official openai client, the token-ID and render APIs, and bad input, against a
real HTTP server (uvicorn on loopback) in front of a P/D design."""

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import httpx
import openai
import pytest
import requests

from actors.api.errors import QUEUE_LIMIT_MESSAGES
from dashboards.exposition import sum_series
from messages import EngineOutput
from tests.factories import ServeThread
from tests.test_images import data_url, picture

pytestmark = pytest.mark.full  # testbed serve over HTTP (in process, and a process): not `make test-fast`

MODEL = "qwen2.5-7b"
VL = ("target.model=qwen2.5-vl-7b", f"target.served_model_name={MODEL}")
"""The same language model with a vision encoder (so images are accepted), served under MODEL."""
IMAGE = {"type": "image_url", "image_url": {"url": data_url(picture(0, (56, 56)))}}
"""A 56 x 56 image: 4 visual tokens."""
WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server():
    s = ServeThread(*VL)
    yield s
    s.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def num_render_calls(server, op="render", **replica):
    """Render (or derender) calls over the whole render pool (or `replica="i"`), as the server's
    /metrics counts them."""
    text = httpx.get(f"{server.url}/metrics").text
    return sum_series([text], "testbed:render_calls_total", op=op, **replica)


def _prompt_len(server, messages, tools=None):
    r = httpx.post(f"{server.url}/render", json={"messages": messages, "tools": tools})
    assert r.status_code == 200
    return r.json()["num_tokens"]


def test_chat_returns_reasoning_a_tool_call_and_usage(server, client):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=WEATHER, max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert choice.message.reasoning  # parsed out of <think>...</think> (vLLM's name)
    assert r.usage.prompt_tokens == _prompt_len(server, ASK, WEATHER)
    assert 10 < r.usage.completion_tokens < 200
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streamed_chat_adds_up_to_the_same_answer(server, client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=WEATHER,
        max_tokens=200,
        stream=True,
        stream_options={"include_usage": True},
    )
    reasoning, content, calls, finish, usage, times = "", "", {}, None, None, []
    for chunk in stream:
        times.append(time.monotonic())
        if chunk.usage:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning", None) or ""
        content += delta.content or ""
        for piece in delta.tool_calls or []:  # a call's first piece names it, the rest add arguments
            call = calls.setdefault(piece.index, {"name": None, "arguments": "", "num_pieces": 0})
            call["name"] = piece.function.name or call["name"]
            call["arguments"] += piece.function.arguments or ""
            call["num_pieces"] += 1
        finish = chunk.choices[0].finish_reason or finish
    whole = client.chat.completions.create(model=MODEL, messages=ASK, tools=WEATHER, max_tokens=200)
    assert reasoning == whole.choices[0].message.reasoning
    (whole_call,) = whole.choices[0].message.tool_calls
    assert list(calls) == [0] and finish == "tool_calls"
    assert (calls[0]["name"], calls[0]["arguments"]) == (
        whole_call.function.name,
        whole_call.function.arguments,
    )
    assert calls[0]["num_pieces"] > 1  # the arguments streamed as they were written
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert times[-1] - times[0] > 0.1  # paced by emulated time, not dumped at once


def test_a_stateless_render_tier_streams_the_same_answer(client):
    """render.derender=stateless: every batch goes to any replica with the whole output so far."""
    s = ServeThread("render.derender=stateless")
    try:
        other = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0)
        chunks = list(
            other.chat.completions.create(
                model=MODEL, messages=ASK, tools=WEATHER, max_tokens=200, stream=True
            )
        )
        metrics = httpx.get(f"{s.url}/metrics").text
    finally:
        s.stop()
    pieces = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning", None) or "" for d in pieces)
    arguments = "".join(t.function.arguments or "" for d in pieces for t in d.tool_calls or [])
    stateful = client.chat.completions.create(model=MODEL, messages=ASK, tools=WEATHER, max_tokens=200)
    assert reasoning == stateful.choices[0].message.reasoning
    assert arguments == stateful.choices[0].message.tool_calls[0].function.arguments
    per_replica = [
        sum_series([metrics], "testbed:render_calls_total", op="derender", replica=str(i)) for i in range(2)
    ]
    assert min(per_replica) > 0  # no affinity: both replicas derendered the one stream


def test_nothing_leaves_before_the_first_token(server):
    """As vLLM: even the role chunk waits for the first token, so a client timing the first event
    measures the emulated TTFT (a long prompt makes it long enough to tell)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "word " * 3000}],
        "max_tokens": 2,
        "stream": True,
    }
    sent = time.monotonic()
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as s:
        lines = (line for line in s.iter_lines() if line)
        first = json.loads(next(lines).removeprefix("data: "))
        first_s = time.monotonic() - sent
        list(lines)
    r = server.served.frontend.results[-1]
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert first_s >= r.token_times_s[0] - r.arrival_s > 0.2


def test_plain_chat_fills_max_tokens(server, client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=40
    )
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 40
    assert r.choices[0].message.reasoning and r.choices[0].message.content


def test_prompt_token_ids_a_pd_proxy_sends_are_used_without_rendering(server, client):
    """llm-d style: the decode side's request carries prefill's prompt IDs in kv_transfer_params."""
    ids = list(range(100, 400))
    renders = num_render_calls(server)
    r = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=5, extra_body={"kv_transfer_params": {"prompt_token_ids": ids}}
    )
    assert r.usage.prompt_tokens == len(ids) != _prompt_len(server, ASK)
    assert num_render_calls(server) == renders + 1  # /render's
    assert server.served.frontend.results[-1].num_prompt_tokens == len(ids)
    echo = client.completions.create(model=MODEL, prompt="x", max_tokens=1)  # other APIs are untouched
    assert echo.usage.prompt_tokens == 1
    image = [{"role": "user", "content": [{"type": "text", "text": "see"}, IMAGE]}]
    r = client.chat.completions.create(
        model=MODEL,
        messages=image,
        max_tokens=1,
        extra_body={"kv_transfer_params": {"prompt_token_ids": ids}},
    )
    assert r.usage.prompt_tokens == _prompt_len(server, image)  # non-text content: rendered all the same


def test_rendering_is_on_the_emulated_path(server, client):
    """TTFT counts from the client's arrival; engines see a request only once it is rendered."""
    long_chat = [{"role": "user", "content": "tell me about the weather " * 400}]
    client.chat.completions.create(model=MODEL, messages=long_chat, max_tokens=4)
    result = server.served.frontend.results[-1]
    assert result.render_s > 0
    assert result.prefill.prefill_times.queued_s == pytest.approx(result.arrival_s + result.render_s)
    assert result.token_times_s[0] - result.arrival_s > result.render_s
    image = [{"role": "user", "content": [{"type": "text", "text": "see " * 400}, IMAGE]}]
    client.chat.completions.create(model=MODEL, messages=image, max_tokens=4)
    result = server.served.frontend.results[-1]  # non-text content: decode's prompt is rendered again
    assert result.handoff_parts["proxy_hop"] > 0


def test_completions_streamed_and_not_with_echo(server, client):
    r = client.completions.create(model=MODEL, prompt="Tell me about prefill", max_tokens=12, echo=True)
    assert r.choices[0].text.startswith("Tell me about prefill") and r.usage.completion_tokens == 12
    text = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="Tell me about prefill", max_tokens=12, stream=True) if c.choices)  # fmt: skip
    assert text == r.choices[0].text[len("Tell me about prefill") :]


def test_models_health_and_metrics_on_the_same_port(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{server.url}/health").status_code == 200
    metrics = httpx.get(f"{server.url}/metrics").text
    for name in (
        "vllm:time_to_first_token_seconds_count",
        "testbed:render_cpu_seconds_total",
        "vllm:nixl_xfer_time_seconds_count",
    ):
        assert name in metrics
    assert metrics.count("# TYPE vllm:num_requests_running gauge") == 1  # one family over all engines


def test_generate_returns_the_exact_token_ids_and_derender_reads_them(server):
    prompt = httpx.post(f"{server.url}/render", json={"messages": ASK}).json()["prompt_token_ids"]
    r = httpx.post(
        f"{server.url}/inference/v1/generate",
        json={"token_ids": prompt, "sampling_params": {"max_tokens": 16}},
    )
    body = r.json()
    assert r.status_code == 200 and len(body["token_ids"]) == 16 and body["finish_reason"] == "length"
    results = server.served.frontend.results
    assert (
        next(x for x in results if x.request_id == body["request_id"]).output_token_ids == body["token_ids"]
    )
    streamed = []
    body_stream = {"token_ids": prompt, "sampling_params": {"max_tokens": 16}, "stream": True}
    with httpx.stream("POST", f"{server.url}/inference/v1/generate", json=body_stream) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                streamed += json.loads(line[6:])["token_ids"]
    assert streamed == body["token_ids"]  # same request, same seeded answer
    d = httpx.post(f"{server.url}/derender", json={"token_ids": body["token_ids"]}).json()
    assert isinstance(d["text"], str) and d["text"]


ROGUE = [{"role": "wizard", "content": "hi"}]
BAD_IDS = {"prompt_token_ids": ["x"]}
BAD = [
    ("/v1/chat/completions", b"{not json", 400, None),
    ("/v1/chat/completions", {"model": "gpt-9", "messages": ASK}, 404, "model"),
    ("/v1/chat/completions", {"model": MODEL, "messages": ASK, "max_tokens": -3}, 400, "max_tokens"),
    ("/v1/chat/completions", {"model": MODEL, "messages": ASK, "max_tokens": 10**9}, 400, "max_tokens"),
    ("/v1/chat/completions", {"model": MODEL, "messages": ROGUE}, 400, "messages.0.role"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": ASK, "kv_transfer_params": BAD_IDS}, 400, "kv_transfer_params.prompt_token_ids"),  # noqa: E501
    ("/v1/chat/completions", {"model": MODEL, "messages": ASK, "kv_transfer_params": {"remote_blok_ids": [1]}}, 400, "kv_transfer_params.remote_blok_ids"),  # noqa: E501
    ("/v1/completions", {"model": MODEL, "prompt": "x", "kv_transfer_params": {"do_remote_decode": "yes"}}, 400, "kv_transfer_params.do_remote_decode"),  # noqa: E501
    ("/v1/completions", {"model": MODEL, "prompt": [1, 2, 99999999]}, 400, "prompt"),
    ("/inference/v1/generate", {"token_ids": ["a", "b"]}, 400, "token_ids.0"),
    ("/inference/v1/generate", {"token_ids": [1, -5]}, 400, "token_ids"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD)
def test_bad_input_gets_an_openai_shaped_error(server, path, body, status, param):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{server.url}{path}", content=data, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"] and err["code"] == status
    if param:
        assert err["param"] == param, err


def test_a_64_mib_body_is_a_413_every_client_reads_and_the_server_keeps_serving(server, client, tmp_path):
    """urllib, `requests`, curl and the openai client all get the error object naming the limit (the
    server reads the refused body before answering: urllib, still writing, saw a reset otherwise)."""
    huge = {"model": MODEL, "messages": [{"role": "user", "content": "x" * (64 * 1024**2)}]}
    body, url = json.dumps(huge).encode(), f"{server.url}/v1/chat/completions"
    json_type = {"content-type": "application/json"}
    answers = []
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(url, data=body, headers=json_type), timeout=60)
    answers.append((e.value.code, json.loads(e.value.read())))
    r = requests.post(url, data=body, headers=json_type, timeout=60)
    answers.append((r.status_code, r.json()))
    (tmp_path / "body.json").write_bytes(body)
    curl = ["curl", "-s", "-w", "\\n%{http_code}", "-H", "content-type: application/json"]
    out = subprocess.run([*curl, "--data-binary", f"@{tmp_path / 'body.json'}", url], capture_output=True)
    text, code = out.stdout.decode().rsplit("\n", 1)
    answers.append((int(code), json.loads(text)))
    with pytest.raises(openai.APIStatusError) as oe:
        client.chat.completions.create(**huge)
    answers.append((oe.value.status_code, oe.value.body and {"error": oe.value.body}))
    for status, answer in answers:
        assert status == 413 and answer["error"]["code"] == 413, answer
        assert "allowed: at most 4194304 bytes" in answer["error"]["message"]
    assert (
        client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4).usage.completion_tokens == 4
    )


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_leaving_mid_answer_cancels_its_request_everywhere(server, stream):
    """Streamed or answered whole (as vLLM's `with_cancellation`): the request is aborted at once, not
    run to its end for nobody."""
    assert server.leave_mid_stream(server.engines_idle, stream=stream).finished_reason == "abort"
    assert all(not r._streams for r in server.served.render_replicas)


def test_api_key_is_required_when_set():
    s = ServeThread(api_key="sekret")
    try:
        denied = openai.OpenAI(base_url=f"{s.url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            denied.models.list()
        allowed = openai.OpenAI(base_url=f"{s.url}/v1", api_key="sekret", max_retries=0)
        assert (
            allowed.chat.completions.create(model=MODEL, messages=ASK, max_tokens=3).usage.completion_tokens
            == 3
        )
        assert httpx.get(f"{s.url}/health").status_code == 200  # health stays open for probes
    finally:
        s.stop()


def _first_visible_s(result):
    """When the first token that shows text (reasoning or content) left: a client's first token."""
    from actors.render.render import Render
    from actors.render.tokenizer import load_tokenizer

    render = Render(load_tokenizer(None, 8192))
    for i, tok in enumerate(result.output_token_ids):
        (delta,) = render.derender("s", [tok], False)
        if delta:
            render.close("s")
            return result.token_times_s[i]
    render.close("s")
    return result.token_times_s[-1]


def test_guidellm_drives_100_requests_and_agrees_with_the_testbeds_own_results(tmp_path):
    """A real third-party load generator (guidellm, from PyPI) against `testbed serve` (the guide's
    pd-testbox, 4k prompts): its client-side TTFT and ITL agree with the testbed's per-request results
    within 10 %, and within 3 % when both count from the first token that shows text."""
    from actors.render.tokenizer import ensure_tokenizer
    from workloads.results import results_frame
    from workloads.summary import lag_summary

    s = ServeThread(design="pd-testbox")
    try:
        report = tmp_path / "guidellm.json"
        cmd = [
            str(Path(sys.executable).with_name("guidellm")),
            "run",
            "--backend", f"kind=openai_http,target={s.url}",
            "--profile", "kind=poisson,rate=2",
            "--data", "kind=synthetic_text,prompt_tokens=4096,output_tokens=32",
            "--constraint", "kind=max_requests,count=110",  # >= 100 finish: guidellm may cut the last
            "--tokenizer", f"kind=huggingface_auto,model={ensure_tokenizer(8192)}",
            "--output", f"kind=json,path={report}",
            "--disable-console",
        ]  # fmt: skip
        # one worker process: its default of 10 busy processes would starve the server of the 2 cores
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "GUIDELLM__MAX_WORKER_PROCESSES": "1"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        metrics = json.loads(report.read_text())["benchmarks"][0]["metrics"]
        results = s.served.frontend.results
        ok = results_frame(results, "pd-fast", 5.0, 0)
        ok = ok[ok["ok"]]
    finally:
        s.stop()
    lag = lag_summary({e.engine_id: e.report() for e in s.served.engines})
    assert lag["lag_fraction"] < 0.05, (
        f"the host could not keep up with emulated time ({lag}): not a fair test"
    )
    assert metrics["request_totals"]["successful"] >= 100 and len(ok) >= 100
    assert metrics["request_totals"]["errored"] == 0
    ttft_ms = metrics["time_to_first_token_ms"]["successful"]["mean"]
    itl_ms = metrics["inter_token_latency_ms"]["successful"]["mean"]
    assert ttft_ms == pytest.approx(ok["ttft_s"].mean() * 1000, rel=0.10)
    assert itl_ms == pytest.approx(ok["tpot_s"].mean() * 1000, rel=0.10)
    # Like with like: guidellm's first token is the first chunk with text, and its ITL spreads the time
    # from there over all tokens but one; the answer's leading `<think>` tokens show no text.
    done = [r for r in results if r.finished_reason in ("length", "stop")]
    visible = [_first_visible_s(r) for r in done]
    visible_ttft_ms = 1000 * statistics.mean(v - r.arrival_s for v, r in zip(visible, done, strict=True))
    visible_itl_ms = 1000 * statistics.mean(
        (r.token_times_s[-1] - v) / (len(r.token_times_s) - 1) for v, r in zip(visible, done, strict=True)
    )
    assert ttft_ms == pytest.approx(visible_ttft_ms, rel=0.03)
    assert itl_ms == pytest.approx(visible_itl_ms, rel=0.03)


def test_the_serve_command_binds_loopback_and_writes_results_when_stopped(tmp_path):
    import pandas as pd

    from tests.factories import free_port, serve_process, stop_serve

    port = free_port()
    proc = serve_process(port, tmp_path, "workload.prompt_len=512")
    try:
        (group,) = json.loads((tmp_path / "targets-serve.json").read_text())  # for `dashboards up`
        labels = {"design": "pd-fast", "actor": "serve", "namespace": "pd-fast", "pod": "serve"}
        assert group == {"targets": [f"127.0.0.1:{port}"], "labels": labels}
        chat = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        assert (
            chat.chat.completions.create(model=MODEL, messages=ASK, max_tokens=5).usage.completion_tokens == 5
        )
    finally:
        out, err = stop_serve(proc)
    assert err.splitlines()[-1] == f"interrupted: 1 request finished; partial results in {tmp_path}"
    assert f"http://127.0.0.1:{port}/v1" in out
    assert json.loads((tmp_path / "targets-serve.json").read_text()) == []
    df = pd.read_parquet(tmp_path / "results.parquet")
    assert len(df) == 1 and df["finished_reason"].tolist() == ["length"]
    assert (tmp_path / "config.yaml").exists() and "vllm:e2e_request_latency_seconds" in (
        tmp_path / "metrics.prom"
    ).read_text()


def test_a_request_failing_inside_is_a_500_or_an_error_event(server, monkeypatch):
    """Failing before its first token: a 500, streamed or not (a stream's status waits for its first
    chunk). Failing after it: the stream ends with an error event, then [DONE]."""

    def failing(num_tokens):
        async def stream(creq, result):
            if num_tokens:
                yield EngineOutput(creq.request_id, [7] * num_tokens, [0.0] * num_tokens)
            result.finished_reason, result.error = "error", "engine prefill-0 crashed"

        return stream

    body = {"model": MODEL, "messages": ASK, "max_tokens": 4}
    monkeypatch.setattr(server.served.frontend.proxy, "stream", failing(0))
    for stream in (False, True):
        r = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "stream": stream})
        assert r.status_code == 500 and "engine prefill-0 crashed" in r.json()["error"]["message"]
    monkeypatch.setattr(server.served.frontend.proxy, "stream", failing(2))
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json={**body, "stream": True}) as s:
        assert s.status_code == 200
        lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
    assert "crashed" in lines[-2] and json.loads(lines[-2][6:])["error"]["type"] == "InternalServerError"
    assert lines[-1] == "data: [DONE]"
    assert server.served.frontend.results[-1].finished_reason == "error"  # reported, not dropped


def test_images_become_visual_tokens_and_bad_ones_are_400s_naming_the_part(server, client):
    """A vision-language target: an image is 256 visual tokens more, encoded in prefill's step; a bad
    image part is a 400 naming it, and the server keeps serving. A text-only target refuses images."""

    def ask(*parts):
        return {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"}, *parts]}]}  # fmt: skip

    image = {"type": "image_url", "image_url": {"url": data_url(picture(1))}}
    plain = client.chat.completions.create(**ask())
    seen = client.chat.completions.create(**ask(image))
    assert seen.usage.prompt_tokens == plain.usage.prompt_tokens + 256 + 2  # pads, vision start and end
    assert num_render_calls(server, op="image") >= 1
    remote = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    broken = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    audio = {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}
    for part, param, words in [
        (remote, "messages[0].content[1]", "only data URLs"),
        (broken, "messages[0].content[1]", "not a decodable image"),
        (audio, "messages.0.content", "type"),
    ]:
        r = httpx.post(f"{server.url}/v1/chat/completions", json=ask(part))
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"].startswith(param) and words in err["message"], err
    assert client.chat.completions.create(**ask(image)).usage.prompt_tokens == seen.usage.prompt_tokens
    text_only = ServeThread()
    try:
        r = httpx.post(f"{text_only.url}/v1/chat/completions", json=ask(image))
        assert r.status_code == 400 and "text only" in r.json()["error"]["message"]
    finally:
        text_only.stop()


def test_past_max_num_queued_tokens_requests_get_vllms_503_streamed_or_not():
    """vLLM's prefill backlog limit on one engine: a burst's requests arriving while a prompt is in
    prefill are refused with vLLM's 503 (its `MaxQueuedTokensError` message, no Retry-After, a JSON
    body for a streamed request too), each a `rejected` row naming the limit and a count under
    `reason="max_num_queued_tokens"`."""
    s = ServeThread("scheduler.max_num_queued_tokens=1", "pools.mixed.replicas=1", design="collocated")
    try:
        body = {"model": s.served.frontend.model_name, "messages": ASK, "max_tokens": 8}

        async def burst():
            async with httpx.AsyncClient(base_url=s.url, timeout=60) as c:
                sends = [
                    c.post("/v1/chat/completions", json={**body, "stream": i % 2 == 1}) for i in range(40)
                ]
                return await asyncio.gather(*sends)

        answers = asyncio.run(burst())
        refused = [r for r in answers if r.status_code == 503]
        assert refused and all(r.status_code in (200, 503) for r in answers)
        assert {json.loads(r.request.content)["stream"] for r in refused} == {True, False}
        assert not any("retry-after" in r.headers for r in refused)
        message = QUEUE_LIMIT_MESSAGES["max_num_queued_tokens"]
        expected = {"error": {"message": message, "type": "Service Unavailable", "param": None, "code": 503}}
        assert all(r.json() == expected for r in refused)
        rows = s.served.frontend.results[-40:]
        assert sum(r.rejected_by == "max_num_queued_tokens" for r in rows) == len(refused)
        metrics = httpx.get(f"{s.url}/metrics").text
        assert sum_series(
            [metrics], "vllm:admission_rejections_total", reason="max_num_queued_tokens"
        ) == len(refused)
    finally:
        s.stop()


def test_beyond_the_admission_limit_requests_get_a_429_and_the_server_keeps_answering():
    """A burst of 120 requests at once against engines that admit 4 waiting each: the rest are refused
    at once (429, Retry-After, the OpenAI error object; a `rejected` row each), streamed or not, and
    /health and /metrics keep answering throughout."""
    s = ServeThread("scheduler.max_waiting=4")
    try:
        body = {"model": s.served.frontend.model_name, "messages": ASK, "max_tokens": 8}

        async def storm():
            async with httpx.AsyncClient(base_url=s.url, timeout=60) as c:

                async def probe():
                    worst = 0.0
                    for _ in range(10):
                        for path in ("/health", "/metrics"):
                            t = time.monotonic()
                            assert (await c.get(path)).status_code == 200
                            worst = max(worst, time.monotonic() - t)
                        await asyncio.sleep(0.05)
                    return worst

                sends = [
                    c.post("/v1/chat/completions", json={**body, "stream": i % 2 == 1}) for i in range(120)
                ]
                *answers, worst_s = await asyncio.gather(*sends, probe())
                return answers, worst_s

        answers, worst_s = asyncio.run(storm())
        refused = [r for r in answers if r.status_code == 429]
        assert len(refused) > 60 and all(r.status_code in (200, 429) for r in answers)
        assert {r.headers["retry-after"] for r in refused} == {"1"}
        assert {r.json()["error"]["code"] for r in refused} == {429}
        assert {json.loads(r.request.content)["stream"] for r in refused} == {True, False}
        # Answering, not fast: a wedged server would hold a probe for the client's 60 s timeout; client and
        # server share one process's GIL here, and on 2 busy cores the worst probe took 0.9-1.05 s.
        assert worst_s < 5.0
        rows = s.served.frontend.results[-120:]
        assert sum(r.finished_reason == "rejected" for r in rows) == len(refused)
        deadline = time.monotonic() + 30
        while not s.engines_idle():
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        s.stop()
