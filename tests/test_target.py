"""`testbed replay --target`: a trace's sessions against a running `testbed serve` (HTTP, streaming),
client-side times against the server's own records."""

import json
import statistics
from pathlib import Path

import pandas as pd
import pytest

from cluster.cli import main
from cluster.cli_run import target_label
from tests.factories import SWE_AGENT, TRACES, free_port, serve_process, stop_serve, swe_agent_through_serve

pytestmark = pytest.mark.full  # replays against a running server process: `make test`, not `make test-fast`
# Those marked `parallel` check no time (each server is on a free port): they may run beside other tests;
# the client's TTFT against the server's runs alone.

MOONCAKE = TRACES / "mooncake_fast25" / "conversation_trace.window_0s_1200s.jsonl"


class Server:
    """`testbed serve` in a process of its own (as a real server is: no interpreter shared with the
    client); its own results are read once it has stopped."""

    def __init__(self, out: Path) -> None:
        self.port, self.out = free_port(), out
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = serve_process(self.port, out, "scheduler.max_model_len=131072")

    def stop(self) -> pd.DataFrame:
        """Stop the server; its own results table."""
        stop_serve(self.proc)
        return pd.read_parquet(self.out / "results.parquet").set_index("request_id")


@pytest.fixture
def server(tmp_path):
    served = Server(tmp_path / "server")
    yield served
    if served.proc.poll() is None:
        served.proc.kill()


def test_swe_agent_sessions_against_testbed_serve_agree_with_its_own_ttft(server, tmp_path):
    argv = [
        "replay",
        "--trace",
        str(SWE_AGENT),
        "--target",
        server.url,
        "--window",
        "0:3",
        "--max-turns",
        "2",
    ]
    assert main([*argv, "--out", str(tmp_path / "client")]) == 0
    client = pd.read_parquet(tmp_path / "client" / "results.parquet")
    own = server.stop()
    assert client["ok"].all() and len(client) >= 4 and client["server_request_id"].notna().all()
    assert client["session_id"].nunique() == len(client) // 2 and set(client["turn"]) == {0, 1}
    # the session went as `conversation_id`: the server's proxy keys routing and bidirectional KV on it
    assert own.loc[client["server_request_id"], "session_id"].tolist() == client["session_id"].tolist()
    ids = client["server_request_id"]
    pairs = [(c, own.loc[rid, "ttft_s"]) for c, rid in zip(client["ttft_s"], ids, strict=True)]
    long = [(c, s) for c, s in pairs if s > 0.2]
    assert long, pairs
    # The client's TTFT holds the server's (the first token leaves the server no earlier than its emulated
    # time) plus HTTP, streaming and the front end's own wait to parse and render a request: on a loaded
    # host that wait alone reaches 0.1 s for a request sent beside another, so the agreement is the median's.
    assert all(c >= s - 0.005 for c, s in long), pairs
    assert statistics.median(c / s for c, s in long) == pytest.approx(1.0, abs=0.10), pairs
    (record,) = json.loads((tmp_path / "client" / "summary.json").read_text())  # one pass, not a design each
    assert record["target"] == server.url and record["completed"] == len(client)
    assert set(client["design"]) == {record["design"]} == {target_label(server.url)}


@pytest.mark.parallel
def test_hash_id_trace_goes_as_token_id_prompts(server, tmp_path):
    argv = ["replay", "--trace", str(MOONCAKE), "--target", server.url, "--window", "0:1", "--speedup", "4"]
    assert main([*argv, "--out", str(tmp_path / "client")]) == 0
    client = pd.read_parquet(tmp_path / "client" / "results.parquet")
    own = server.stop()
    fits = client["num_prompt_tokens"] + client["max_tokens"] <= 131072
    assert fits.sum() >= 2 and client.loc[fits, "ok"].all()
    # the server counted the very prompts the trace gave (token IDs: nothing rendered)
    sent = client[fits]
    for rid, n in zip(sent["server_request_id"], sent["num_prompt_tokens"], strict=True):
        assert own.loc[rid, "num_prompt_tokens"] == n
    # and the tokens it generated, as its usage says (not the client's count of chunks)
    assert (
        sent["server_num_output_tokens"] == own.loc[sent["server_request_id"], "num_output_tokens"].values
    ).all()


@pytest.mark.parallel
def test_a_design_with_a_target_is_one_line(capsys):
    """Designs apply to the testbed; a server is replayed once, whatever the preset's designs."""
    assert (
        main(["replay", "--trace", str(MOONCAKE), "--target", "http://127.0.0.1:9", "--design", "pd-fast"])
        == 2
    )
    err = capsys.readouterr().err
    assert "--design=pd-fast: designs apply to the testbed only" in err and err.count("\n") == 1


@pytest.mark.parallel
def test_an_unreachable_target_is_one_line(capsys):
    assert main(["replay", "--trace", str(MOONCAKE), "--target", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "--target=http://127.0.0.1:9: no model listed at /v1/models" in err and err.count("\n") == 1


KEEP_REASONING = "replay.chat_template_kwargs={keep_past_reasoning: true}"
BASH_TOOL = (
    "replay.tools=[{type: function, function: {name: bash, parameters: {type: object,"
    " properties: {command: {type: string}}, required: [command]}}}]"
)


def bidirectional_replay(tmp_path: Path, *sets: str) -> pd.DataFrame:
    """The SWE-agent sessions starting in the first 3 s, 3 turns each, on their own answers through
    `testbed serve` in P/D with bidirectional KV (verified reuse): the server's later turns, each
    with its previous answer's length and the full blocks decode holds of the turn before."""
    own = swe_agent_through_serve(tmp_path, "pd-bidirectional", *sets)
    assert own["session_id"].nunique() >= 4
    previous = own.groupby("session_id")[["num_prompt_tokens", "num_output_tokens"]].shift()
    own["previous_answer"] = previous["num_output_tokens"]
    # decode computed the previous prompt and answer but its last token; full blocks only
    own["decode_held_tokens"] = (previous.sum(axis=1) - 1) // 16 * 16
    return own[own["previous_answer"].notna()]


@pytest.mark.parallel
@pytest.mark.parametrize("keep_reasoning", [True, False])
def test_swe_agent_on_its_own_answers_through_bidirectional_pd_pulls_each_answer_back(
    tmp_path, keep_reasoning
):
    """Each turn sends the server's own answer back. With the answer's reasoning kept in the history,
    prefill pulls each answer back from decode and computes only the rest (one-way P/D computes
    prompt - cached); where the template drops past reasoning (its default), the history differs from
    decode's sequence from the answer's first token on: nothing is pulled and nothing moves."""
    later = bidirectional_replay(tmp_path, *([KEEP_REASONING] if keep_reasoning else []))
    pulled = later["prefill_pulled_back_tokens"].fillna(0)
    one_way = later["num_prompt_tokens"] - later["prefill_cached_tokens"]  # what one-way P/D computes
    if keep_reasoning:  # all of the previous answer's full blocks but the last token's
        assert (pulled >= later["previous_answer"] - 2 * 16).all(), later
        assert (later["prompt_computed_tokens"] == one_way - pulled).all()
    else:
        assert (pulled == 0).all() and (later["prefill_pulled_back_bytes"].fillna(0) == 0).all()
        assert (later["prompt_computed_tokens"] == one_way).all()


@pytest.mark.parallel
def test_a_harness_reserialising_tool_calls_stops_verified_reuse_inside_the_call(tmp_path):
    """The same sessions given a bash tool: every answer is reasoning and a call (about 50 tokens).
    Sent back as the server gave it, prefill reuses all decode holds of the turn before (its own cache,
    then the pull back); with the call's arguments re-serialised, verified reuse stops at the block
    where they start (in the answer's last 16 tokens), one block short where that block is full."""
    for edit, sets in (("verbatim", ()), ("edited", ("replay.harness_edit=reserialize_tool_calls",))):
        later = bidirectional_replay(tmp_path / edit, KEEP_REASONING, BASH_TOOL, *sets)
        assert (later["previous_answer"] < 100).all()  # a call, then EOS
        reused = later["prefill_cached_tokens"] + later["prefill_pulled_back_tokens"]
        short = (later["decode_held_tokens"] - reused).tolist()
        assert set(short) == ({0} if edit == "verbatim" else {0, 16}), short


@pytest.mark.parallel
@pytest.mark.parametrize(
    ("status", "finished_reason"), [(503, "rejected"), (429, "rejected"), (400, "error"), (500, "error")]
)
def test_a_servers_overload_answer_is_a_rejection(status, finished_reason):
    """vLLM's queue limits answer 503 and a gateway's 429: the request was refused, not broken."""
    import asyncio

    import httpx

    from messages import ClientRequest
    from workloads.openai_target import OpenAITarget

    body = {"error": {"message": "busy", "type": "Service Unavailable", "param": None, "code": status}}
    target = OpenAITarget("http://server", "m", now=lambda: 0.0)
    target.client = httpx.AsyncClient(
        base_url="http://server", transport=httpx.MockTransport(lambda _: httpx.Response(status, json=body))
    )
    result = asyncio.run(target.submit(ClientRequest("r0", 0.0, [1, 2, 3], 4)))
    assert result.finished_reason == finished_reason and result.error.startswith(f"HTTP {status}: ")


@pytest.mark.parallel
def test_an_error_event_in_the_stream_ends_the_request_as_the_server_says():
    """vLLM sends a refusal that comes after its stream began as the stream's one event."""
    import asyncio

    import httpx

    from messages import ClientRequest
    from workloads.openai_target import OpenAITarget

    event = {"error": {"message": "busy", "type": "Service Unavailable", "param": None, "code": 503}}
    sse = f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n"
    target = OpenAITarget("http://server", "m", now=lambda: 0.0)
    target.client = httpx.AsyncClient(
        base_url="http://server",
        transport=httpx.MockTransport(
            lambda _: httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})
        ),
    )
    result = asyncio.run(target.submit(ClientRequest("r0", 0.0, [1, 2, 3], 4)))
    assert result.finished_reason == "rejected" and "busy" in result.error and not result.token_times_s
