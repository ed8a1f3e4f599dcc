"""Bidirectional KV (multi-turn P/D): decode keeps a conversation's last turn, prefill pulls back what
it lacks of it; verified reuse never hands prefill KV of other tokens, positional does when the
history was edited (vLLM issue #43094)."""

import json

import numpy as np
import pytest

from actors.engine.clock import Clock
from cluster.config_load import load_designs
from cluster.virtual import build_deployment, run_virtual
from messages import ClientRequest
from tests.factories import COLLOCATED, PD, SIX_TURN, TRACES, make_config, run_async, run_requests
from workloads.harness import answer_in_history
from workloads.results import results_frame
from workloads.traces.session import FollowUp


def six_turn(**kv_transfer):
    cfg = make_config(
        PD,
        runner={"compute": "skip"},
        workload={"kind": "multi_turn"},
        multi_turn=SIX_TURN,
        kv_transfer={"link": "rdma-400g", **kv_transfer},
    )
    results, _ = run_requests(cfg, None)
    return results_frame(results, "pd", 0.0, 0)


def test_six_turn_one_way_recomputes_each_answer_and_bidirectional_pulls_it_back():
    one_way, both = six_turn(), six_turn(bidirectional=True)
    # one way: prefill's own cache holds the previous prompt, not the answer decode produced:
    # 600 answer tokens + 400 new ones (+8 where a turn's prompt ends mid-block)
    assert one_way["prompt_computed_tokens"].tolist() == [4000, 1000, 1008, 1000, 1008, 1000]
    # bidirectional: the answer's blocks come back from decode; only the new message is computed
    assert both["prompt_computed_tokens"].tolist() == [4000, 408, 416, 408, 416, 408]
    assert (both["prefill_pulled_back_tokens"].iloc[1:] == 592).all()
    assert (both["ttft_s"].iloc[1:].to_numpy() < one_way["ttft_s"].iloc[1:].to_numpy()).all()
    assert both["ok"].all() and not both["prefill_kv_pull_back_failed"].fillna(False).any()


def test_expired_conversation_blocks_fall_back_to_recompute_and_say_so():
    df = six_turn(bidirectional=True, decoder_kv_blocks_ttl_s=0.5)  # turns come 1 s after answers
    assert df["ok"].all()
    assert df["prefill_kv_pull_back_failed"].iloc[1:].all()
    assert df["prompt_computed_tokens"].tolist() == [4000, 1000, 1008, 1000, 1008, 1000]


ANSWER = 128
"""Turn 1's answer: its first 32 tokens stand for reasoning a template drops from the history."""
REAL = {"runner": {"compute": "real", "device": "cpu"}, "workload": {"output_policy": "greedy"}}


def two_turns(cfg, first, follow_up, edit):
    """Turn 1, then turn 2 = turn 1's prompt + `edit`(its answer) + `follow_up`, one conversation."""

    async def main():
        dep = build_deployment(cfg, Clock())
        for e in dep.engines:
            e.start()
        one = await dep.proxy.submit(ClientRequest("t1", 0.0, first, ANSWER, session_id="c"))
        prompt = first + edit(one.output_token_ids) + follow_up
        two = await dep.proxy.submit(ClientRequest("t2", dep.clock.now(), prompt, 16, session_id="c"))
        await dep.drain()
        for e in dep.engines:
            e.assert_empty()
        return one, two

    return run_async(main())


EDITS = {
    "none": FollowUp(()),
    "strip": FollowUp((), strip_answer_tokens=32),  # a template dropping past reasoning
    "rewrite": FollowUp((), rewrite_answer_tokens=64),  # a harness re-serialising the tool call
}


@pytest.mark.parametrize(
    ("edit", "reuse"),
    [("strip", "verified"), ("strip", "positional"), ("rewrite", "verified"), ("rewrite", "positional"),
     ("none", "positional")],
)  # fmt: skip
def test_positional_reuse_gives_wrong_tokens_after_an_edited_history_and_verified_never(edit, reuse):
    """Real compute, greedy: the second turn's tokens against the same conversation served collocated
    with prefix caching. Dropping the answer's first 32 tokens from the history (a template stripping
    past reasoning) makes positional reuse load KV of other tokens at those positions (128 tokens'
    worth here: the tiny runner's greedy tokens shrug off a few wrong ones); rewriting its last 64 (a
    harness) does at those 64. Verified stops at the edit: nothing of the answer after a strip, all
    but the rewritten tail's blocks after a rewrite."""
    rng = np.random.default_rng(5)
    first, follow_up = rng.integers(0, 8192, 150).tolist(), rng.integers(0, 8192, 40).tolist()

    def edited(answer):
        return answer_in_history(answer, EDITS[edit], 8192)

    bidi = make_config(PD, REAL, kv_transfer={"bidirectional": True, "reuse": reuse})
    _, two = two_turns(bidi, first, follow_up, edited)
    _, reference = two_turns(make_config(COLLOCATED, REAL), first, follow_up, edited)
    pulled = two.prefill.prefill_times.num_external_tokens
    if reuse == "verified":
        # prefill's cache holds turn 1's prompt (144 of its 150 tokens: full blocks); a rewrite keeps
        # the answer's head, whose full blocks come back: (150 + 128 - 64) // 16 * 16 - 144
        assert pulled == {"strip": 0, "rewrite": 64}[edit]
    else:
        assert pulled > 0
    if edit != "none" and reuse == "positional":
        assert two.output_token_ids != reference.output_token_ids  # KV of other tokens: wrong logits
    else:
        assert two.output_token_ids == reference.output_token_ids


def test_pull_backs_are_labelled_d2p_and_held_conversations_are_gauged():
    from cluster.virtual import run_virtual
    from dashboards import metrics as m
    from dashboards.exposition import sum_series

    cfg = make_config(
        PD,
        runner={"compute": "skip"},
        workload={"kind": "multi_turn"},
        multi_turn=SIX_TURN,
        kv_transfer={"link": "rdma-400g", "bidirectional": True},
    )
    out = run_virtual(cfg)
    expos = list(out.metrics.values())
    assert sum_series(expos, m.KV_HANDOFF.count, direction="d2p", role="prefill") == 5  # turns 2-6
    assert sum_series(expos, m.KV_HANDOFF.count, direction="p2d", role="decode") == 6
    assert sum_series(expos, m.KV_PULL_BACK_FAILED.exposed) == 0


def test_six_turn_preset_prints_each_turn_for_each_design(tmp_path, capsys, monkeypatch):
    import pandas as pd

    from cluster.cli import main

    monkeypatch.setenv("COLUMNS", "200")  # headers unwrapped

    assert main(["replay", "--preset", "six-turn-l40s", "--compute", "skip", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "per turn" in out and "MiB pulled back" in out
    df = pd.read_parquet(tmp_path / "results.parquet")
    computed = {d: part["prompt_computed_tokens"].tolist() for d, part in df.groupby("design")}
    assert computed["collocated"][1:] == computed["pd-bidirectional"][1:] == [408, 416, 408, 416, 408]
    assert computed["pd-positional"] == computed["pd-bidirectional"]  # the history was not edited
    assert computed["pd-one-way"][1:] == [1000, 1008, 1000, 1008, 1000]
    # a chat repeats its answers: the ideal the report sets the hits beside keeps them too
    records = {r["design"]: r for r in json.loads((tmp_path / "summary.json").read_text())}
    ideal = records["collocated"]["theoretical_prefix_hit_rate_with_answers"]
    assert records["collocated"]["prefix_hit_rate"] <= ideal
    assert (
        ideal
        > records["collocated"]["theoretical_prefix_hit_rate"]
        > records["pd-one-way"]["prefix_hit_rate"] - 1e-9
    )
    assert "keeping answers too" in (tmp_path / "report.html").read_text()


@pytest.mark.full  # ~2 min of real compute: `make test`, not `make test-fast`
@pytest.mark.parallel  # replays in virtual time: no port, no wall-clock time
def test_a_conversation_on_the_models_own_answers_diverges_only_under_positional_reuse(tmp_path):
    """Four turns whose history is the model's own greedy answers, each answer's first 32 tokens dropped
    (a template stripping past reasoning) or its last 64 rewritten (a harness), through the
    six-turn-l40s designs: every turn of one-way and verified bidirectional P/D matches the collocated
    reference token for token; positional reuse diverges after the first turn (and is checked to match
    where the history was not edited)."""
    import json

    import pandas as pd

    from cluster.cli import main

    small = [
        "--compute", "real", "--output-policy", "greedy",
        "--set", "multi_turn.num_turns=constant:4", "--set", "multi_turn.prefix_tokens=constant:150",
        "--set", "multi_turn.user_tokens=constant:40", "--set", "multi_turn.output_tokens=constant:128",
        "--set", "multi_turn.history=model", "--set", "runner.device=cpu",
    ]  # fmt: skip

    def run(out, *extra):
        assert main(["replay", "--preset", "six-turn-l40s", *small, *extra, "--out", str(out)]) == 0
        df = pd.read_parquet(out / "results.parquet")
        records = {r["design"]: r for r in json.loads((out / "summary.json").read_text())}
        return df, records

    def pulled(df, design):
        return df[df["design"] == design]["prefill_pulled_back_tokens"].iloc[1:]

    df, stripped = run(tmp_path / "stripped", "--set", "multi_turn.strip_answer_tokens=32")
    assert {r["reference"] for r in stripped.values()} == {"collocated"}
    assert (
        stripped["pd-one-way"]["diverged_fraction"] == stripped["pd-bidirectional"]["diverged_fraction"] == 0
    )
    assert (pulled(df, "pd-bidirectional") == 0).all()  # verified stops where the history was edited
    assert stripped["pd-positional"]["diverged_fraction"] >= 0.5  # turns 2-4: most of them
    assert (tmp_path / "stripped" / "plots" / "divergence.png").exists()
    # a harness rewriting each answer's last 64 tokens: verified takes the answer's head, still exact
    df, rewritten = run(tmp_path / "rewritten", "--set", "multi_turn.rewrite_answer_tokens=64")
    assert (
        rewritten["pd-bidirectional"]["diverged_fraction"] == 0
        and (pulled(df, "pd-bidirectional") >= 64).all()
    )
    assert rewritten["pd-positional"]["diverged_fraction"] >= 0.5
    _, unedited = run(tmp_path / "unedited")
    assert unedited["pd-positional"]["diverged_fraction"] == 0


MOONCAKE = TRACES / "mooncake_fast25" / "conversation_trace.window_0s_1200s.jsonl"


@pytest.mark.parametrize("design", ["pd-bidirectional-host", "collocated-host"])
def test_every_request_of_the_mooncake_minute_completes_when_decode_keeps_turns(design):
    """The first minute of the Mooncake window through the offload preset: its sessions are one turn
    each, so every turn decode keeps is never pulled back. Pinned for their 480 s TTL they filled
    decode, new requests waited for blocks past prefill's 120 s hold and 41 of 162 pulls found
    nothing held; kept turns now give way first. Every engine is checked empty after the replay."""
    (cfg,) = load_designs(
        "offload-h200",
        [design],
        [f"replay.trace={MOONCAKE}", "replay.window_s=[0,60]", "runner.compute=skip"],
    )
    results = run_virtual(cfg, metrics=False).results
    assert len(results) == 162
    assert results["ok"].all(), results.loc[~results["ok"], "error"].head(3).tolist()
