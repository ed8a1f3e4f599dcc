"""Trace loaders on the shared excerpts, bad files, token synthesis and the theoretical hit rate."""

import itertools
import json

import numpy as np
import pytest

from tests.factories import TRACES
from workloads.traces import load_trace
from workloads.traces.prefix_reuse import theoretical_hit_rate
from workloads.traces.session import HashPrompt, Session, Trace, TraceError, Turn
from workloads.traces.tokens import TokenSynthesizer

MOONCAKE = TRACES / "mooncake_fast25" / "conversation_trace.window_0s_1200s.jsonl"
AZURE_CODE = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.before_1845.csv"
AZURE_CONV = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.before_1845.csv"
WEKA = TRACES / "weka_claude_code"


def test_mooncake_excerpt_is_3658_open_loop_requests_on_512_token_blocks():
    trace = load_trace(MOONCAKE)
    assert trace.num_requests == 3658 and len(trace.sessions) == 3658 and not trace.closed_loop
    assert trace.block_size == 512
    first = trace.sessions[0].turns[0]
    assert first.t_s == 0.0 and first.prompt.num_tokens == 6758 and first.max_tokens == 500
    assert first.prompt.hash_ids == tuple(range(14))
    assert max(s.turns[0].t_s for s in trace.sessions) < 1200.0
    for s in trace.sessions:
        p = s.turns[0].prompt
        assert len(p.hash_ids) == -(-p.num_tokens // 512)
    # Shared leading IDs (block 0 is a common system prompt): a third of the tokens could hit.
    assert theoretical_hit_rate(trace) == pytest.approx(0.3234, abs=1e-4)


def test_mooncake_sessions_and_delays(tmp_path):
    def row(t, n, ids, **extra):
        return {"timestamp": t, "input_length": n, "output_length": 10, "hash_ids": ids, **extra}

    rows = [
        row(0, 600, [1, 2], session_id="a"),
        row(0, 100, [9]),
        row(5000, 1200, [1, 3, 4], session_id="a"),
        row(5000, 1300, [1, 3, 4], session_id="a", delay=250),
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    trace = load_trace(path, "mooncake")
    a, single = trace.sessions
    assert trace.closed_loop and [len(a.turns), len(single.turns)] == [3, 1]
    assert [t.think_s for t in a.turns] == [0.0, 5.0, 0.25]  # the timestamp gap, then the delay
    # Turn 1's partial block 2 is where turn 2's block 3 begins: linked, so its tokens are a prefix.
    assert a.turns[0].prompt.hash_ids == (1, 3)
    synth = TokenSynthesizer(8192, 512)
    one, two = (synth.tokens(t.prompt) for t in a.turns[:2])
    assert two[:600] == one and len(two) == 1200


@pytest.mark.parametrize(("path", "rows"), [(AZURE_CODE, 5100), (AZURE_CONV, 9754)])
def test_azure_excerpts_are_open_loop_without_sharing(path, rows):
    trace = load_trace(path)
    assert trace.num_requests == rows and not trace.closed_loop
    first = trace.sessions[0].turns[0]
    assert first.t_s == 0.0
    ts = [s.turns[0].t_s for s in trace.sessions]
    assert ts == sorted(ts) and 1600 < ts[-1] < 1755  # from 18:15:4x to before 18:45:00
    assert theoretical_hit_rate(trace) == 0.0
    if path == AZURE_CODE:
        assert first.prompt.num_tokens == 4808 and first.max_tokens == 10


def test_weka_excerpt_is_eleven_sessions_with_four_subagents_in_one():
    trace = load_trace(WEKA)
    assert len(trace.sessions) == 11 and trace.block_size == 64
    assert sum(len(s.turns) for s in trace.sessions) == 501
    subs = [s for s in trace.all_sessions() if s.parent is not None]
    assert len(subs) == 4 and {s.parent for s in subs} == {"trace_0010"}
    assert sum(len(s.turns) for s in subs) == 50
    t10 = next(s for s in trace.sessions if s.session_id == "trace_0010")
    spawner = next(t for t in t10.turns if t.subagents)
    assert len(spawner.subagents) == 1 and spawner.subagents[0].session_id == "trace_0010/agent_001"
    assert spawner.subagents[0].turns[0].t_s == pytest.approx(100.65)  # the entry's t + its own 0
    # Namespaces per file: two files' ID 1 are different blocks.
    namespaces = {s.turns[0].prompt.namespace for s in trace.sessions}
    assert len(namespaces) == 11
    assert theoretical_hit_rate(trace) == pytest.approx(0.9449, abs=1e-4)


def test_weka_turns_continue_each_other_token_for_token():
    """Where a turn's IDs extend the previous turn's, the previous prompt (its unhashed tail included)
    is a token prefix of the next, so forced answers can be the very tokens the next turn repeats."""
    trace = load_trace(WEKA / "trace_0002.json")
    synth = TokenSynthesizer(8192, 64)
    turns = trace.sessions[0].turns
    continued = 0
    for a, b in itertools.pairwise(turns):
        pa, pb = synth.tokens(a.prompt), synth.tokens(b.prompt)
        full = a.prompt.num_tokens // 64
        if b.prompt.hash_ids[:full] == a.prompt.hash_ids[:full]:
            assert pb[: len(pa)] == pa
            answer = synth.answer(pa, pb, a.max_tokens, "x")
            assert len(answer) == a.max_tokens
            continued += 1
    assert continued >= 0.8 * (len(turns) - 1)  # 28 of 32 here: the rest drop history (compaction)


def test_token_synthesis_is_deterministic_and_scoped():
    synth, other = TokenSynthesizer(8192, 64), TokenSynthesizer(8192, 64)
    p = HashPrompt((5, 6, 7), 150, "weka/a")
    assert synth.tokens(p) == other.tokens(p) and len(synth.tokens(p)) == 150
    q = HashPrompt((5, 6, 7), 150, "weka/b")
    assert synth.tokens(q)[:64] != synth.tokens(p)[:64]  # another file's ID 5
    assert synth.tokens(p, salt="/user-2")[:64] != synth.tokens(p)[:64]
    assert max(synth.tokens(p)) < 8192


def test_theoretical_hit_rate_counts_leading_shared_full_blocks():
    def turn(ids, n, t):
        return Turn(HashPrompt(ids, n, "x"), 1, t)

    trace = Trace("t", [Session("a", [turn((1, 2), 128, 0.0), turn((1, 2, 3), 150, 1.0)]),
                        Session("b", [turn((1, 9), 128, 0.5)])], block_size=64)  # fmt: skip
    # b: block 1 (64 of 128); a's second: blocks 1, 2 (128 of 150; 3 is partial)
    assert theoretical_hit_rate(trace) == pytest.approx((64 + 128) / (128 + 150 + 128))


BAD = [
    ("t.jsonl", '{"timestamp": 0, "output_length": 3, "hash_ids": [1]}', r"t\.jsonl:1: input_length: None"),
    ("t.jsonl", '{"timestamp": 0, "input_length": -4, "output_length": 3, "hash_ids": [1]}',
     r"t\.jsonl:1: input_length: -4: expected an integer >= 1"),
    ("t.jsonl", '{"timestamp": 9, "input_length": 4, "output_length": 3, "hash_ids": [1]}\n'
     '{"timestamp": 2, "input_length": 4, "output_length": 3, "hash_ids": [1]}',
     r"t\.jsonl:2: timestamp: 2 ms: earlier than the line before \(unsorted\)"),
    ("t.jsonl", '{"timestamp": 0, "input_length": 4, "output_length": 3, "hash_ids": [1], "session_id": 1, '
     '"delay": 5}', r"t\.jsonl:1: delay: given on a session's first turn"),
    ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,12,-1",
     r"t\.csv:2: GeneratedTokens: '-1': expected an integer >= 1"),
    ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,12,1", r"t\.csv:2: TIMESTAMP: 'yesterday'"),
    ("t.json", '{"block_size": 64, "requests": [{"t": 0, "in": 100, "out": 5, "hash_ids": [1, 2]}]}',
     r"t\.json: requests\[0\]\.hash_ids: 2 IDs: expected in // block_size = 1"),
    ("t.txt", "hello", r"t\.txt:1: format: cannot tell the format; allowed: mooncake, azure, weka"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "text", "message"), BAD, ids=[m[2][:40] for m in BAD])
def test_a_bad_trace_is_one_line_naming_file_line_and_field(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError, match=message) as e:
        load_trace(path)
    assert "\n" not in str(e.value)


def test_weka_rows_draw_the_same_answer_for_the_same_request():
    synth = TokenSynthesizer(8192, 64)
    prompt = list(np.arange(10))
    assert synth.answer(prompt, None, 5, "r1") == synth.answer(prompt, None, 5, "r1")
    assert synth.answer(prompt, None, 5, "r1") != synth.answer(prompt, None, 5, "r2")


SWE = TRACES / "swebench_mini_swe_agent_gemini3" / "trajs"


def test_swe_agent_excerpt_is_sixteen_concurrent_sessions_of_chat_prompts():
    trace = load_trace(SWE)
    assert len(trace.sessions) == 16 and trace.num_requests == 579  # the README's 579 LLM calls
    assert min(s.start_s for s in trace.sessions) == 0.0
    assert max(t.t_s for s in trace.sessions for t in s.turns) < 14 * 60  # 22:55:06 to 23:08:58
    first = trace.sessions[0].turns
    assert [m["role"] for m in first[0].prompt.messages] == ["system", "user"]
    assert len(first[1].prompt.messages) == 4  # + the first answer and its tool output
    assert all(t.api_s is not None and t.api_s >= 0 for t in first[:-1])
    assert theoretical_hit_rate(trace) is None  # known once rendered


def test_swe_agent_prompts_render_to_growing_prefixes():
    from actors.render.client import render_for
    from tests.factories import make_config

    render = render_for(make_config())
    trace = load_trace(SWE / "django__django-11299.traj.json")
    synth = TokenSynthesizer(8192, None, render_chat=render.render_chat)
    turns = trace.sessions[0].turns
    prompts = [synth.tokens(t.prompt) for t in turns[:4]]
    for a, b in itertools.pairwise(prompts):
        assert len(b) > len(a) and b[: len(a)] == a  # strict prefix growth: forced answers can hit


SERVEGEN = TRACES / "servegen" / "data"


def test_servegen_samples_the_busiest_window_of_the_chosen_clients():
    trace = load_trace(SERVEGEN / "reason" / "deepseek-r1", seed=0)
    assert not trace.closed_loop and len(trace.sessions) > 1000
    times = [s.start_s for s in trace.sessions]
    start = min(times)
    assert times == sorted(times) and max(times) - start < 600 and start % 600 < 600
    again = load_trace(SERVEGEN / "reason" / "deepseek-r1", seed=0)
    assert [s.turns[0].prompt.num_tokens for s in again.sessions] == [
        s.turns[0].prompt.num_tokens for s in trace.sessions
    ]  # deterministic for a seed
    one = load_trace(SERVEGEN / "multimodal" / "mm-image", window_s=(36000.0, 36600.0), clients=(0,))
    assert one.sessions and {s.session_id.split("-")[0] for s in one.sessions} == {"client0"}
    # image requests: text (136 or 372 tokens) and one image of 525 visual tokens and up
    assert all(s.turns[0].prompt.num_tokens >= 136 for s in one.sessions)
    assert all(len(s.turns[0].image_tokens) == 1 and s.turns[0].image_tokens[0] >= 525 for s in one.sessions)
    assert theoretical_hit_rate(one) == 0.0


def test_servegen_rates_follow_the_fitted_windows():
    """Client 0's mm-image rate in each 600 s window is its trace row's; the sample's count matches
    within Poisson-like noise."""
    import csv

    text = (SERVEGEN / "multimodal" / "mm-image" / "chunk-0-trace.csv").read_text()
    rows = list(csv.reader(text.splitlines()))
    busy = max(rows, key=lambda r: float(r[1]))
    start, rate = float(busy[0]), float(busy[1])
    trace = load_trace(SERVEGEN / "multimodal" / "mm-image", window_s=(start, start + 600), clients=(0,))
    expected = rate * 600
    assert abs(len(trace.sessions) - expected) < 5 * expected**0.5 + 5


def test_servegen_unknown_client_is_one_line():
    with pytest.raises(TraceError, match=r"clients: \[99\]: no such client here; allowed: \[0, 1"):
        load_trace(SERVEGEN / "reason" / "deepseek-r1", clients=(99,))
