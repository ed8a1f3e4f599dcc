"""The testbed's HTTP API against a real `vllm serve` of the tiny model (`vllm_serve.py`, one start for the
module): `testbed replay --target` completes a real trace's window on it, with vLLM's usage and
reasoning; `testbed serve` answers the same requests with the same shapes (keys and JSON types, streamed
and not), the same error bodies, and the same HTTP instrumentation families.

The tiny model is random: vLLM's reasoning parser (`deepseek_r1`) reads everything before `</think>` as
reasoning, so its answers are reasoning, with content only where it happened to sample `</think>`; the
shape checks cut the testbed's answers inside their reasoning to match. Tool calls are not compared (the
random model does not write `<tool_call>` JSON).
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.cli import main
from tests.factories import SWE_AGENT, ServeThread
from tests.vllm_serve import MAX_NUM_QUEUED_REQS, VllmServe

pytestmark = pytest.mark.full  # a real vLLM server (about 100 s to start): `make test`, not `make test-fast`
# Not `parallel`: its server's threads slow the tests beside it by more than the minute it takes alone,
# and its refusals race its long answers.

ASK = [{"role": "user", "content": "Tell me about prefill"}]
SHORT = 5
"""Tokens per answer in the shape checks: the testbed's forced answer is still inside its reasoning."""


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    server = VllmServe(tmp_path_factory.mktemp("vllm") / "serve.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def testbed():
    server = ServeThread()
    yield server
    server.stop()


def _model(server: Any) -> str:
    return server.model if isinstance(server, VllmServe) else str(server.served.frontend.model_name)


def test_replay_of_a_real_trace_against_vllm_serve_completes_with_its_usage_and_reasoning(vllm, tmp_path):
    """SWE-agent sessions (two turns each, the trace's own history) as streamed chat completions: every
    request completes; output and cached counts are vLLM's `usage`; reasoning comes as `delta.reasoning`,
    is stamped like any text and kept as the next turn's `reasoning_content`."""
    argv = ["replay", "--trace", str(SWE_AGENT), "--target", vllm.url, "--window", "0:3", "--max-turns", "2",
            "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0, vllm.log_tail()
    df = pd.read_parquet(tmp_path / "results.parquet")
    assert len(df) >= 4 and df["ok"].all(), df[["finished_reason", "error"]].to_string()
    assert set(df["turn"]) == {0, 1} and df["server_request_id"].str.startswith("chatcmpl-").all()
    assert (df["server_num_output_tokens"] == df["max_tokens"]).all()  # ignore_eos, as vLLM counted them
    assert (df["num_output_tokens"] == df["server_num_output_tokens"]).all()
    cached = df["server_num_cached_tokens"]
    assert cached.notna().all() and (cached % 32 == 0).all()  # whole blocks of 32
    assert (df.loc[df["turn"] == 1, "server_num_cached_tokens"] > 0).all()  # the first turn's prompt again
    for message, times, n in zip(df["answer_message"], df["token_times_s"], df["max_tokens"], strict=True):
        assert message["reasoning_content"]  # content only after a `</think>` it happened to sample
        assert 1 < len(times) <= n + 1  # the role chunk's, then one per chunk that showed text


def shape(value: Any, path: str = "") -> set[tuple[str, str]]:
    """(key path, JSON type) of every value in `value`; list items share the path `[]`."""
    if isinstance(value, dict):
        out = {(path, "object")}
        for key, item in value.items():
            out |= shape(item, f"{path}.{key}")
        return out
    if isinstance(value, list):
        return {(path, "array")}.union(*(shape(item, f"{path}[]") for item in value))
    names = {bool: "boolean", int: "number", float: "number", str: "string", type(None): "null"}
    return {(path, names[type(value)])}


def chunk_kind(chunk: dict[str, Any]) -> str:
    """Which of a stream's chunks this is: role (the first), token, finish (its choice finishes), usage."""
    if "usage" in chunk:
        return "usage"
    choice = chunk["choices"][0]
    if (choice.get("delta") or {}).get("role"):
        return "role"
    return "finish" if choice["finish_reason"] else "token"


def answer_shapes(server: Any, path: str, body: dict[str, Any]) -> dict[str, set[tuple[str, str]]]:
    """The shape of `server`'s answer to `body`: the whole body's, or a stream's per chunk kind."""
    r = httpx.post(f"{server.url}{path}", json={"model": _model(server), **body}, timeout=120)
    assert r.status_code == 200, r.text
    if not body.get("stream"):
        return {"whole": shape(r.json())}
    lines = [line for line in r.text.splitlines() if line]
    assert lines[-1] == "data: [DONE]"
    shapes: dict[str, set[tuple[str, str]]] = {}
    for line in lines[:-1]:
        chunk = json.loads(line.removeprefix("data: "))
        shapes.setdefault(chunk_kind(chunk), set()).update(shape(chunk))
    return shapes


def differences(ours: dict[str, set[Any]], theirs: dict[str, set[Any]]) -> dict[str, Any]:
    """What only the testbed has, and what only vLLM has, by part."""
    out = {}
    for part in sorted(ours.keys() | theirs.keys()):
        mine, vllms = ours.get(part, set()), theirs.get(part, set())
        if mine != vllms:
            out[part] = {"testbed only": sorted(mine - vllms), "vllm only": sorted(vllms - mine)}
    return out


USAGE = {"stream_options": {"include_usage": True}}
REQUESTS = {
    "chat": ("/v1/chat/completions", {"messages": ASK, "max_tokens": SHORT}),
    "chat streamed": (
        "/v1/chat/completions",
        {"messages": ASK, "max_tokens": SHORT, "stream": True, **USAGE},
    ),
    "completion": ("/v1/completions", {"prompt": "Tell me about prefill", "max_tokens": SHORT}),
    "completion streamed": (
        "/v1/completions",
        {"prompt": [11, 12, 13, 14], "max_tokens": SHORT, "stream": True, **USAGE},
    ),
}


@pytest.mark.parametrize("name", list(REQUESTS))
def test_testbed_serve_answers_in_vllms_shapes(vllm, testbed, name):
    path, body = REQUESTS[name]
    ours, theirs = answer_shapes(testbed, path, body), answer_shapes(vllm, path, body)
    assert not differences(ours, theirs), json.dumps(differences(ours, theirs), indent=1)


WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def test_a_streamed_tool_call_has_vllms_shape(vllm, testbed):
    """`tool_choice: required` with thinking off: vLLM's structured output makes even the random model
    write a call (its arguments do not close within max_tokens, so only the role chunk and the call's
    pieces are compared): the first piece names the call, later ones add arguments, `content` null."""
    body = {"messages": ASK, "tools": WEATHER, "tool_choice": "required", "max_tokens": 40, "stream": True,
            "chat_template_kwargs": {"enable_thinking": False}}  # fmt: skip
    ours, theirs = (answer_shapes(s, "/v1/chat/completions", body) for s in (testbed, vllm))
    assert (".choices[].delta.tool_calls[].function.name", "string") in theirs["token"]
    parts = ("role", "token")
    assert not differences({k: ours[k] for k in parts}, {k: theirs[k] for k in parts})


def test_the_model_list_has_vllms_shape(vllm, testbed):
    ours, theirs = (shape(httpx.get(f"{s.url}/v1/models").json()) for s in (testbed, vllm))
    assert not differences({"models": ours}, {"models": theirs})


def error_shape(r: httpx.Response) -> set[tuple[str, str]]:
    """An error body's shape; `param` is a string or null alike (vLLM names it for some errors only)."""
    return {(path, "string|null" if path == ".error.param" else kind) for path, kind in shape(r.json())}


def post(server: Any, path: str, body: dict[str, Any] | bytes) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps({"model": _model(server), **body}).encode()
    return httpx.post(
        f"{server.url}{path}", content=data, headers={"content-type": "application/json"}, timeout=60
    )


ERRORS = [
    ("/v1/chat/completions", b"{not json", 400),
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": -3}, 400),
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 10**9}, 400),
    ("/v1/chat/completions", {"messages": ASK, "model": "gpt-9"}, 404),
    ("/v1/completions", {"prompt": [1, 2, 99999999]}, 400),
    ("/v1/no-such-route", {}, 404),
]


@pytest.mark.parametrize(("path", "body", "status"), ERRORS)
def test_errors_have_vllms_status_and_body(vllm, testbed, path, body, status):
    ours, theirs = post(testbed, path, body), post(vllm, path, body)
    assert ours.status_code == theirs.status_code == status, (ours.text, theirs.text)
    assert error_shape(ours) == error_shape(theirs), (ours.text, theirs.text)


def test_a_body_too_large_is_a_413_in_vllms_error_shape(vllm, testbed):
    """vLLM 0.32 has no body limit: it reads a 5 MiB prompt whole and refuses it as a 400 (more characters
    than its longest prompt may have). The testbed refuses the body itself (over 4 MiB): a 413, same body."""
    body = {"messages": [{"role": "user", "content": "word " * (1024**2 + 1)}], "max_tokens": 2}
    ours, theirs = post(testbed, "/v1/chat/completions", body), post(vllm, "/v1/chat/completions", body)
    assert (ours.status_code, theirs.status_code) == (413, 400), (ours.text, theirs.text)
    assert error_shape(ours) == error_shape(theirs)


async def _burst(server: Any, num: int, max_tokens: int) -> list[httpx.Response]:
    """`num` chat requests at once, every second one streamed (each response read whole)."""
    body = {"model": _model(server), "messages": ASK, "max_tokens": max_tokens, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
        sends = [client.post("/v1/chat/completions", json={**body, "stream": i % 2 == 1}) for i in range(num)]
        return await asyncio.gather(*sends)


def _family_sums(server: Any, family: str, label: str | None = None) -> dict[str | None, float]:
    """The samples of `family` on `server`'s /metrics, summed by the value of `label` (None: all)."""
    out: dict[str | None, float] = {}
    for f in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text):
        for s in f.samples if f.name == family else ():
            key = s.labels[label] if label else None
            out[key] = out.get(key, 0.0) + s.value
    return out


LONG_ANSWER_TOKENS = 16_000
"""Tokens of each answer that fills a server: none may finish before the probes, even on a busy machine
(vLLM's CPU build decodes the tiny model's 16 answers at a few ms a step, so 4,000 tokens once ended
under load while the test's client waited for its turn)."""


async def _refused_while_full(server: Any, num_probes: int) -> list[httpx.Response]:
    """Fill `server` with `MAX_NUM_QUEUED_REQS` long streamed answers, wait for each one's first chunk (it
    is in the engine then, for `LONG_ANSWER_TOKENS`), then send `num_probes` requests one at a time, every
    second one streamed; the long answers' clients then hang up (aborting them)."""
    body = {"model": _model(server), "messages": ASK, "ignore_eos": True}
    reading: list[Any] = []  # (a line iterator dropped would close its stream: the request would be aborted)
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as client, AsyncExitStack() as streams:

        async def fill() -> None:
            long = {**body, "max_tokens": LONG_ANSWER_TOKENS, "stream": True}
            r = await streams.enter_async_context(client.stream("POST", "/v1/chat/completions", json=long))
            assert r.status_code == 200
            reading.append(r.aiter_lines())
            await anext(reading[-1])

        await asyncio.gather(*[fill() for _ in range(MAX_NUM_QUEUED_REQS)])
        probes = []
        for i in range(num_probes):
            probe = {**body, "max_tokens": 8, "stream": i % 2 == 1}
            probes.append(await client.post("/v1/chat/completions", json=probe))
    return probes


def _stream_events(r: httpx.Response) -> list[Any]:
    """A stream's events, JSON decoded (`[DONE]` as it is)."""
    events = [line.removeprefix("data: ") for line in r.text.splitlines() if line]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def _error_events(r: httpx.Response) -> bool:
    """A started stream that carries an error event."""
    started = r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    return started and any(isinstance(e, dict) and "error" in e for e in _stream_events(r))


def test_a_request_past_max_num_queued_reqs_is_vllms_503(vllm):
    """Both holding `--max-num-queued-reqs 16` requests (one testbed engine, as one vLLM instance), a
    request is refused alike, streamed or not: a 503 before any stream starts, the same body to the
    character (vLLM's message, `type` "Service Unavailable", `param` null, `code` 503), no
    Retry-After, counted under `reason="max_num_queued_reqs"`. In a burst through vLLM's own renderer,
    a streamed request can pass vLLM's check before rendering and fail the one after: vLLM has then
    started its stream (200) and sends that body as an error event; the testbed, whose engines get
    token IDs from the render tier, checks once and answers 503."""
    server = ServeThread(
        f"scheduler.max_num_queued_reqs={MAX_NUM_QUEUED_REQS}", "pools.mixed.replicas=1", design="collocated"
    )
    answers, counted = {}, {}
    try:
        for side, target in (("vLLM", vllm), ("testbed", server)):
            before = _family_sums(target, "vllm:admission_rejections", "reason")
            answers[side] = asyncio.run(_refused_while_full(target, 4))
            after = _family_sums(target, "vllm:admission_rejections", "reason")
            counted[side] = {k: v - before.get(k, 0.0) for k, v in after.items()}
        ours_burst = asyncio.run(_burst(server, 3 * MAX_NUM_QUEUED_REQS, 100))
        deadline = time.monotonic() + 30
        while not server.engines_idle():
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        server.stop()
    for side, probes in answers.items():
        assert [r.status_code for r in probes] == [503] * 4, (side, [r.text for r in probes])
        assert all(r.headers["content-type"] == "application/json" for r in probes), side
        assert not any("retry-after" in r.headers for r in probes), side
        assert counted[side] == {"max_num_queued_reqs": 4, "max_num_queued_tokens": 0}, side
    body = answers["vLLM"][0].json()
    assert all(r.json() == body for probes in answers.values() for r in probes), body
    theirs_burst = asyncio.run(_burst(vllm, 3 * MAX_NUM_QUEUED_REQS, 100))
    for side, burst in (("vLLM", theirs_burst), ("testbed", ours_burst)):
        refused = [r for r in burst if r.status_code == 503 or _error_events(r)]
        assert refused and all(r.status_code in (200, 503) for r in burst), side
        for r in refused:
            if r.status_code == 503:
                assert r.json() == body, side
            else:  # vLLM only: a stream started before the check that refused it
                assert side == "vLLM" and _stream_events(r) == [body, "[DONE]"], r.text


def test_the_gateways_shedding_is_a_429_in_vllms_error_shape(vllm):
    """`scheduler.max_waiting` (a gateway's, not vLLM's) answers 429 with Retry-After, in the body shape
    of vLLM's 503."""
    (refused,) = asyncio.run(_refused_while_full(vllm, 1))
    gateway = ServeThread("scheduler.max_waiting=4")
    try:
        shed = asyncio.run(_burst(gateway, 60, 8))
    finally:
        gateway.stop()
    assert {r.status_code for r in shed} == {200, 429}
    mine = next(r for r in shed if r.status_code == 429)
    assert mine.headers["retry-after"] == "1" and mine.json()["error"]["code"] == 429
    assert error_shape(mine) == error_shape(refused), (mine.text, refused.text)


def http_families(text: str) -> dict[str, tuple[str, frozenset[str], frozenset[str]]]:
    """Each `http_*` family: its type, label names and histogram buckets (each counter's, histogram's and
    summary's `_created` times a gauge family of their own)."""
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("http_"):
            labels = {name for s in family.samples for name in s.labels} - {"le", "quantile"}
            buckets = {s.labels["le"] for s in family.samples if "le" in s.labels}
            out[family.name] = (family.type, frozenset(labels), frozenset(buckets))
    return out


def test_http_instrumentation_families_are_vllms(vllm, testbed):
    """prometheus-fastapi-instrumentator as vLLM configures it: the same families, types, labels and
    buckets (and /metrics and /health left out of them)."""
    for server in (testbed, vllm):
        assert post(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 2}).status_code == 200
        httpx.get(f"{server.url}/health")
    ours, theirs = (http_families(httpx.get(f"{s.url}/metrics").text) for s in (testbed, vllm))
    assert set(theirs) >= {
        "http_requests",
        "http_request_duration_seconds",
        "http_request_duration_highr_seconds",
        "http_requests_created",
    }
    assert ours == theirs
    text = httpx.get(f"{testbed.url}/metrics").text
    counted = {s.labels["handler"] for f in text_string_to_metric_families(text) if f.name == "http_requests"
               for s in f.samples}  # fmt: skip
    assert "/v1/chat/completions" in counted and not counted & {"/health", "/metrics"}
