"""Attention-FFN disaggregation with real compute: the runner computes attention and its FFN ranks (in
process here) every sparse MoE block, and the result is the collocated runner's: logits, final hidden
states, greedy tokens and the router's expert counts, over prefill chunks and batched decodes; and a
virtual run with `pools.mixed.afd` emits the greedy tokens of the same run without it."""

from contextlib import contextmanager

import numpy as np
import pytest
import torch

import cluster.engines
from actors.engine.runner.ffn_client import AfdConnector, attention_rank
from actors.engine.runner.model_runner import ModelRunner, RunnerInput
from actors.engine.runner.tiny_model import load_model, model_dir
from actors.ffn.worker import FfnWorker, LocalFfnRanks
from emulation.config import RunnerConfig
from tests.factories import COLLOCATED, make_config, make_requests, run_requests
from tests.runner_checks import prompt

MOE = RunnerConfig(device="cpu", architecture="qwen3_moe")


class RecordedRanks(LocalFfnRanks):
    """In-process FFN ranks that keep what crossed: (layer, rank, rows) per call, per `forward`."""

    def __init__(self, workers):
        super().__init__(workers)
        self.calls = []

    def forward(self, batches):
        self.calls.append(
            [(b.layer, j, len(b.hidden_states)) for j, b in enumerate(batches) if b is not None]
        )
        return super().forward(batches)


def afd_runner(model, num_attention_ranks, num_ffn_ranks, num_blocks=64):
    workers = [FfnWorker.load(str(model_dir(MOE)), "cpu") for _ in range(num_ffn_ranks)]
    ranks = RecordedRanks(workers)
    connector = AfdConnector(ranks, num_attention_ranks)
    return ModelRunner(model, num_blocks=num_blocks, block_size=16, ffn=connector), ranks


@contextmanager
def outputs_of(model):
    """The logits and final hidden states (the final norm's input) the runner's steps computed."""
    logits, hidden = [], []
    hooks = [
        model.lm_head.register_forward_hook(lambda _m, _i, out: logits.append(out.clone())),
        model.model.norm.register_forward_hook(lambda _m, args, _o: hidden.append(args[0].clone())),
    ]
    try:
        yield logits, hidden
    finally:
        for h in hooks:
            h.remove()


def test_the_ffn_rank_holds_only_the_moe_blocks_loaded_apart_from_the_engines_model():
    model = load_model(MOE)
    worker = FfnWorker.load(str(model_dir(MOE)), "cpu")
    assert worker.layers == list(range(model.config.num_hidden_layers))
    block = worker._blocks[0]
    assert block is not model.model.layers[0].mlp  # its own copy, from the checkpoint
    assert {name.split(".")[0] for name, _ in block.named_parameters()} == {"gate", "experts"}
    for a, b in zip(block.parameters(), model.model.layers[0].mlp.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_requests_stay_on_their_attention_rank_and_ffn_rank_j_serves_ranks_j_a_over_f_on():
    ids = [f"req-{i}" for i in range(64)]
    assert [attention_rank(r, 4) for r in ids] == [attention_rank(r, 4) for r in ids]  # stable
    assert set(attention_rank(r, 4) for r in ids) == {0, 1, 2, 3}
    connector = AfdConnector(LocalFfnRanks([None, None]), 4)  # (workers not called)
    assert all(connector.ffn_rank(r) == attention_rank(r, 4) // 2 for r in ids)
    rows = connector.rows([("req-0", 3), ("req-1", 2), ("req-2", 1)], torch.device("cpu"))
    packed = [r.tolist() if r is not None else [] for r in rows]
    assert sorted(i for r in packed for i in r) == list(range(6))  # every row once
    for rid, (lo, hi) in zip(("req-0", "req-1", "req-2"), ((0, 3), (3, 5), (5, 6)), strict=True):
        assert set(range(lo, hi)) <= set(packed[connector.ffn_rank(rid)])


STEPS = [  # (request, new tokens) per step; a request's first entry is its prompt's first chunk
    [("a", 64), ("b", 60), ("c", 40)],
    [("a", 86), ("b", 1), ("c", 1), ("d", 90)],
    [("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", 33)],
    [("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", 1)],
    [("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", 1)],
    [("b", 1), ("c", 1), ("e", 1)],
]
PROMPTS = {"a": 150, "b": 60, "c": 40, "d": 90, "e": 33}


@pytest.mark.parametrize(("num_attention_ranks", "num_ffn_ranks"), [(2, 1), (4, 2), (2, 2)])
def test_the_disaggregated_runner_computes_the_collocated_runners_steps(num_attention_ranks, num_ffn_ranks):
    """Prefill chunks (one after a first chunk), prompts joining decodes, batched decodes: every step's
    tokens, logits, final hidden states and expert counts are the collocated runner's; each layer of a
    step is one call to the FFN ranks, each rank sent only its attention ranks' rows."""
    model = load_model(MOE)
    colo = ModelRunner(model, num_blocks=64, block_size=16)
    afd, ranks = afd_runner(model, num_attention_ranks, num_ffn_ranks)
    seqs = {rid: prompt(n, i) for i, (rid, n) in enumerate(PROMPTS.items())}
    done = dict.fromkeys(PROMPTS, 0)
    blocks = {rid: list(range(12 * i, 12 * i + 12)) for i, rid in enumerate(PROMPTS)}
    seen_ranks = set()
    for step in STEPS:
        items = [
            RunnerInput(rid, seqs[rid][done[rid] : done[rid] + n], done[rid], blocks[rid], 190, False)
            for rid, n in step
        ]
        for it in items:
            it.needs_logits = it.start_pos + len(it.token_ids) == len(seqs[it.request_id])
        results = []
        for runner in (colo, afd):
            with outputs_of(model) as (logits, hidden):
                tokens = runner.execute(items)
            results.append((tokens, logits, hidden, runner.last_expert_counts))
        (tokens, logits, hidden, counts), (afd_tokens, afd_logits, afd_hidden, afd_counts) = results
        assert afd_tokens == tokens
        torch.testing.assert_close(afd_logits, logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(afd_hidden, hidden, atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(afd_counts, counts)
        calls = ranks.calls[-model.config.num_hidden_layers :]
        assert [{layer for layer, _, _ in call} for call in calls] == [{0}, {1}]  # a call per layer
        for call in calls:
            by_rank = {j: n for _, j, n in call}
            expected = {}
            for rid, n in step:
                j = afd.ffn.ffn_rank(rid)
                expected[j] = expected.get(j, 0) + n
            assert by_rank == expected
            seen_ranks |= set(by_rank)
        ranks.calls.clear()
        for (rid, n), tok in zip(step, tokens, strict=True):
            done[rid] += n
            if tok is not None:
                seqs[rid].append(tok)
    assert seen_ranks == set(range(num_ffn_ranks))  # every FFN rank computed
    for runner in (colo, afd):
        for rid in PROMPTS:
            runner.release(rid)
        runner.assert_empty()


MOE_TARGET = {
    "runner": {"compute": "real", "device": "cpu", "architecture": "qwen3_moe"},
    "workload": {"output_policy": "greedy"},
    "target": {"model": "qwen3-30b-a3b", "time_model": "operators"},
    "pools": {"mixed": {"gpu": "h100-sxm"}},
}
AFD = {"pools": {"mixed": {"afd": {"num_attention_ranks": 2, "num_ffn_ranks": 1, "link": "rdma-400g"}}}}


def test_a_virtual_run_with_afd_emits_the_greedy_tokens_of_the_run_without(monkeypatch):
    """Through the normal entry point: the engine's runner computes attention, one in-process FFN rank
    the experts (every step's every layer); the tokens are those of the same target run without AFD
    (its times are AFD's own)."""
    built = []
    in_process = cluster.engines.ffn_workers
    monkeypatch.setattr(
        cluster.engines,
        "ffn_workers",
        lambda cfg, n: built.append(RecordedRanks(in_process(cfg, n).workers)) or built[-1],
    )
    prompts = make_requests(8, [1, 16, 17, 40, 75, 110, 150, 200], 10, seed=7, gap_s=0.3)
    colo, _ = run_requests(make_config(COLLOCATED, MOE_TARGET), prompts)
    assert not built
    afd, dep = run_requests(make_config(COLLOCATED, MOE_TARGET, AFD), prompts)
    (engine,) = dep.engines
    (ranks,) = built
    assert engine.executor.runner.ffn.ranks is ranks and len(ranks.workers) == 1
    steps = engine.report().counters.num_steps
    assert steps > 10 and len(ranks.calls) >= 2 * steps  # 2 layers (a step may run in two passes)
    assert [r.finished_reason for r in colo + afd] == ["length"] * 16
    assert [r.output_token_ids for r in afd] == [r.output_token_ids for r in colo]


def test_afd_with_compute_skip_builds_no_ffn_rank():
    cfg = make_config(
        COLLOCATED, MOE_TARGET, AFD, runner={"compute": "skip"}, workload={"output_policy": "forced"}
    )
    _, dep = run_requests(cfg, make_requests(2, 40, 4, forced=True))
    assert dep.engines[0].executor.runner is None


def test_pd_with_both_pools_disaggregated_emits_the_collocated_tokens():
    """Prefill and decode both attention-FFN disaggregated (prefill 2:1, decode 4:2): prompt chunks and
    decodes cross at every layer, the KV handoff between the attention sides, the collocated run's tokens."""
    prompts = make_requests(6, [30, 64, 90, 130, 170, 200], 8, seed=3, gap_s=0.3)
    colo, _ = run_requests(make_config(COLLOCATED, MOE_TARGET), prompts)
    afd = {"link": "rdma-400g", "num_micro_batches": 3}
    pools = {
        "mixed": {"replicas": 0},
        "prefill": {"replicas": 1, "gpu": "h100-sxm", "afd": {**afd, "num_attention_ranks": 2}},
        "decode": {
            "replicas": 1, "gpu": "h100-sxm", "afd": {**afd, "num_attention_ranks": 4, "num_ffn_ranks": 2}
        },
    }  # fmt: skip
    pd, dep = run_requests(make_config(MOE_TARGET, pools=pools), prompts)
    assert all(e.executor.runner.ffn is not None for e in dep.engines)
    assert [r.finished_reason for r in pd] == ["length"] * 6
    assert [r.output_token_ids for r in pd] == [r.output_token_ids for r in colo]
