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
from typing import Any

import httpx
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.cli import main
from tests.factories import SWE_AGENT, ServeThread
from tests.vllm_serve import MAX_NUM_QUEUED_REQS, VllmServe

pytestmark = pytest.mark.full  # a real vLLM server (about 100 s to start): `make test`, not `make test-fast`

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
    body = {"model": _model(server), "messages": ASK, "max_tokens": max_tokens, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
        return await asyncio.gather(*[client.post("/v1/chat/completions", json=body) for _ in range(num)])


def test_a_refused_request_has_vllms_error_shape(vllm):
    """vLLM 0.32 has no 429: past `--max-num-queued-reqs` it answers 503 (Service Unavailable). The
    testbed's admission limit (`scheduler.max_waiting`) answers 429 with Retry-After, in the same body."""
    theirs = asyncio.run(_burst(vllm, 3 * MAX_NUM_QUEUED_REQS, 100))
    assert {r.status_code for r in theirs} == {200, 503}, {r.status_code for r in theirs}
    refused = next(r for r in theirs if r.status_code == 503)
    server = ServeThread("scheduler.max_waiting=4")
    try:
        ours = asyncio.run(_burst(server, 60, 8))
    finally:
        server.stop()
    assert {r.status_code for r in ours} == {200, 429}
    mine = next(r for r in ours if r.status_code == 429)
    assert mine.headers["retry-after"] == "1" and mine.json()["error"]["code"] == 429
    assert error_shape(mine) == error_shape(refused), (mine.text, refused.text)


def http_families(text: str) -> dict[str, tuple[str, frozenset[str], frozenset[str]]]:
    """Each `http_*` family: its type, label names and histogram buckets (`_created` series aside)."""
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("http_") and not family.name.endswith("_created"):
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
    }
    assert ours == theirs
    text = httpx.get(f"{testbed.url}/metrics").text
    counted = {s.labels["handler"] for f in text_string_to_metric_families(text) if f.name == "http_requests"
               for s in f.samples}  # fmt: skip
    assert "/v1/chat/completions" in counted and not counted & {"/health", "/metrics"}
