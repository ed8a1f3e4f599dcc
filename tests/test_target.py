"""`testbed replay --target`: a trace's sessions against a running `testbed serve` (HTTP, streaming),
client-side times against the server's own records."""

import json
import signal
from pathlib import Path

import pandas as pd
import pytest

from cluster.cli import main
from tests.factories import TRACES, free_port, serve_process

SWE = TRACES / "swebench_mini_swe_agent_gemini3" / "trajs"
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
        self.proc.send_signal(signal.SIGINT)
        _, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err[-2000:]
        return pd.read_parquet(self.out / "results.parquet").set_index("request_id")


@pytest.fixture
def server(tmp_path):
    served = Server(tmp_path / "server")
    yield served
    if served.proc.poll() is None:
        served.proc.kill()


def test_swe_agent_sessions_against_testbed_serve_agree_with_its_own_ttft(server, tmp_path):
    argv = ["replay", "--trace", str(SWE), "--target", server.url, "--window", "0:3", "--max-turns", "2"]
    assert main([*argv, "--design", "pd-fast", "--out", str(tmp_path / "client")]) == 0
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
    for c, s in long:  # the client adds HTTP and streaming to the server's emulated TTFT
        assert c == pytest.approx(s, rel=0.10), pairs
    record = json.loads((tmp_path / "client" / "summary.json").read_text())[0]
    assert record["target"] == server.url and record["completed"] == len(client)


def test_hash_id_trace_goes_as_token_id_prompts(server, tmp_path):
    argv = ["replay", "--trace", str(MOONCAKE), "--target", server.url, "--window", "0:1", "--speedup", "4"]
    assert main([*argv, "--design", "pd-fast", "--out", str(tmp_path / "client")]) == 0
    client = pd.read_parquet(tmp_path / "client" / "results.parquet")
    own = server.stop()
    fits = client["num_prompt_tokens"] + client["max_tokens"] <= 131072
    assert fits.sum() >= 2 and client.loc[fits, "ok"].all()
    # the server counted the very prompts the trace gave (token IDs: nothing rendered)
    sent = client[fits]
    for rid, n in zip(sent["server_request_id"], sent["num_prompt_tokens"], strict=True):
        assert own.loc[rid, "num_prompt_tokens"] == n


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
    """The SWE-agent sessions starting in the first 3 s, 3 turns each, on their own answers
    (`replay.history=model`) through `testbed serve` in P/D with bidirectional KV (verified reuse);
    the server's results, each later turn with its previous answer's length."""
    design = ("--preset", "six-turn-l40s", "--design", "pd-bidirectional", "--time-scale", "0.2")
    port, out = free_port(), tmp_path / "server"
    proc = serve_process(port, out, "scheduler.max_model_len=65536", design=design)
    try:
        argv = ["replay", "--trace", str(SWE), "--target", f"http://127.0.0.1:{port}", "--window", "0:3",
                "--max-turns", "3", "--preset", "six-turn-l40s", "--design", "pd-bidirectional",
                "--set", "replay.history=model", "--out", str(tmp_path / "client")]  # fmt: skip
        for s in sets:
            argv += ["--set", s]
        assert main(argv) == 0
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    own = pd.read_parquet(out / "results.parquet").sort_values("arrival_s")
    assert own["ok"].all() and own["session_id"].nunique() >= 4
    own["previous_answer"] = own.groupby("session_id")["num_output_tokens"].shift()
    return own[own["previous_answer"].notna()].set_index(["session_id", "arrival_s"]).sort_index()


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


def test_a_harness_reserialising_tool_calls_stops_verified_reuse_inside_the_call(tmp_path):
    """The same sessions given a bash tool: every answer is reasoning and a call. Sent back as the
    server gave it, the whole answer is pulled back; with its arguments re-serialised, verified reuse
    stops at the first block holding them (the next turn's prompt differs from decode's sequence
    there)."""
    verbatim = bidirectional_replay(tmp_path / "verbatim", KEEP_REASONING, BASH_TOOL)
    edited = bidirectional_replay(
        tmp_path / "edited", KEEP_REASONING, BASH_TOOL, "replay.harness_edit=reserialize_tool_calls"
    )
    assert (verbatim["prefill_pulled_back_tokens"] >= verbatim["previous_answer"] - 2 * 16).all()
    assert (verbatim["previous_answer"] < 100).all()  # a call, then EOS
    shortfall = (
        verbatim["prefill_pulled_back_tokens"].to_numpy() - edited["prefill_pulled_back_tokens"].to_numpy()
    )
    # the arguments sit in the answer's last 16 tokens: reuse stops one block short where they start
    # in a full block, and takes the same where they fall in the answer's last, partial block
    assert set(shortfall) == {0, 16}, shortfall
