"""Hostile HTTP input: every endpoint of a running `testbed serve` (uvicorn on loopback, a P/D design)
fuzzed from its own OpenAPI schema by schemathesis, with a fixed example budget: no 5xx, no hang, and
the server still serves a request afterwards, with nothing left in its engines.

Hypothesis drives schemathesis's strategies directly (one test per operation): its pytest plugin
reads a pytest attribute that pytest 9 no longer has."""

from __future__ import annotations

import openai
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from tests.factories import ServeThread

pytestmark = [
    pytest.mark.full,  # the HTTP API fuzzed over a running server: `make test`, not `make test-fast`
    pytest.mark.parallel,  # a server on a free port; no time is checked
]

EXAMPLES_PER_OPERATION = 50
"""Hypothesis examples per endpoint and method (the same ones every run: derandomized)."""
OPERATIONS = [
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/render"),
    ("POST", "/derender"),
    ("POST", "/inference/v1/generate"),
]


@pytest.fixture(scope="module")
def server():
    s = ServeThread()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def operations(server):
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    return {(op.method.upper(), op.path): op for op in (r.ok() for r in schema.get_all_operations())}


def test_the_schema_lists_the_fuzzed_operations(operations):
    assert sorted(operations) == sorted(OPERATIONS)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_no_endpoint_answers_fuzzed_input_with_a_server_error(server, operations, method, path):
    @given(case=operations[(method, path)].as_strategy())
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case):
        case.call_and_validate(base_url=server.url, checks=[not_a_server_error], timeout=30)

    fuzz()


def test_the_server_still_serves_after_the_fuzzing(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    ask = [{"role": "user", "content": "still there?"}]
    assert (
        client.chat.completions.create(model=model, messages=ask, max_tokens=3).usage.completion_tokens == 3
    )
    assert server.engines_idle(), "a fuzzed request left work in an engine"
