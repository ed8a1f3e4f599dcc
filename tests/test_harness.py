"""The client side of a conversation: histories rebuilt from the model's answers, with the edits
templates and harnesses make."""

import json

from messages import RequestResult, ServerRecord
from tests.factories import make_config
from workloads.harness import Harness, answer_in_history, reserialized
from workloads.openai_target import _add_delta
from workloads.traces.session import ChatPrompt, FollowUp

SYSTEM = {"role": "system", "content": "You fix bugs."}
TASK = {"role": "user", "content": "Fix the test."}
TRACE_ANSWER = {"role": "assistant", "content": "ls"}
OBSERVATION = {"role": "user", "content": "a.py b.py"}
MODEL_ANSWER = {
    "role": "assistant",
    "content": "",
    "reasoning_content": "look first",
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
    ],
}


def chat(*messages):
    return ChatPrompt(tuple(messages), 0)


def replay_cfg(**replay):
    return make_config(replay=replay).replay


def test_token_edits_strip_the_head_and_rewrite_the_tail_keeping_its_length():
    answer = [10, 11, 12, 13, 14, 15]
    assert answer_in_history(answer, FollowUp((), strip_answer_tokens=2), 100) == [12, 13, 14, 15]
    assert answer_in_history(answer, FollowUp((), rewrite_answer_tokens=2), 100) == [10, 11, 12, 13, 15, 16]
    assert answer_in_history([99], FollowUp((), rewrite_answer_tokens=3), 100) == [0]  # wraps the vocabulary


def test_reserialized_tool_calls_are_compact_and_other_messages_untouched():
    edited = reserialized(MODEL_ANSWER)
    assert edited["tool_calls"][0]["function"]["arguments"] == '{"cmd":"ls"}'
    assert json.loads(edited["tool_calls"][0]["function"]["arguments"]) == {"cmd": "ls"}
    assert MODEL_ANSWER["tool_calls"][0]["function"]["arguments"] == '{"cmd": "ls"}'  # not mutated
    assert reserialized(TRACE_ANSWER) is TRACE_ANSWER
    bad = {**MODEL_ANSWER, "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}]}
    assert reserialized(bad)["tool_calls"][0]["function"]["arguments"] == "not json"


def answered(harness, prompt, message):
    """`prompt` sent, `message` the answer; the messages sent."""
    sent = harness.messages(prompt)
    harness.answered([], RequestResult("r", 0.0, 1, 1, server=ServerRecord(answer_message=message)), None)
    return sent


def test_model_history_sends_the_servers_answer_in_place_of_the_traces():
    harness = Harness(replay_cfg(history="model", harness_edit="reserialize_tool_calls"), 100)
    answered(harness, chat(SYSTEM, TASK), MODEL_ANSWER)
    sent = answered(harness, chat(SYSTEM, TASK, TRACE_ANSWER, OBSERVATION), TRACE_ANSWER)
    assert sent == [SYSTEM, TASK, reserialized(MODEL_ANSWER), OBSERVATION]
    # the turn after builds on what was sent, not on the trace
    third = harness.messages(chat(SYSTEM, TASK, TRACE_ANSWER, OBSERVATION, TRACE_ANSWER, OBSERVATION))
    assert third == [SYSTEM, TASK, reserialized(MODEL_ANSWER), OBSERVATION, TRACE_ANSWER, OBSERVATION]


def test_the_traces_messages_where_its_history_does_not_continue_or_history_is_trace():
    harness = Harness(replay_cfg(history="model"), 100)
    answered(harness, chat(SYSTEM, TASK), MODEL_ANSWER)
    compacted = chat(SYSTEM, {"role": "user", "content": "summary"}, TRACE_ANSWER, OBSERVATION)
    assert harness.messages(compacted) == list(compacted.messages)
    failed = Harness(replay_cfg(history="model"), 100)
    answered(failed, chat(SYSTEM, TASK), None)  # no answer came back: the trace's history
    assert failed.messages(chat(SYSTEM, TASK, TRACE_ANSWER)) == [SYSTEM, TASK, TRACE_ANSWER]
    verbatim = Harness(replay_cfg(), 100)
    answered(verbatim, chat(SYSTEM, TASK), MODEL_ANSWER)
    assert verbatim.messages(chat(SYSTEM, TASK, TRACE_ANSWER)) == [SYSTEM, TASK, TRACE_ANSWER]


def test_streamed_deltas_add_up_to_the_answer_message():
    result = RequestResult("r", 0.0, 1, 1)
    for delta in [
        {"role": "assistant", "reasoning_content": "look "},
        {"reasoning_content": "first"},
        {"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "bash"}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"cmd": '}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '"ls"}'}}]},
    ]:
        _add_delta(result, delta)
    assert result.server.answer_message == MODEL_ANSWER


def test_an_edit_without_model_history_is_refused_naming_the_field():
    import pytest

    from cluster.config_load import ConfigError

    with pytest.raises(
        ConfigError, match=r"replay.harness_edit='reserialize_tool_calls'.*replay.history=model"
    ):
        make_config(replay={"harness_edit": "reserialize_tool_calls"})
    with pytest.raises(ConfigError, match=r"multi_turn.rewrite_answer_tokens=8.*multi_turn.history=model"):
        make_config(multi_turn={"rewrite_answer_tokens": 8})
