"""The runner with the tiny Qwen3-MoE model: its paged, packed forward equals the model's own forward; P/D
emits collocated's greedy tokens; other architectures are refused."""

import copy
import hashlib
import json

import numpy as np
import pytest
import torch

from actors.engine.runner.arch import UnsupportedModelError, check_runner_model
from actors.engine.runner.model_runner import ModelRunner, RunnerInput
from actors.engine.runner.tiny_model import load_model, model_dir
from emulation.config import RunnerConfig
from tests.factories import COLLOCATED, PD, make_config, make_requests, run_requests
from tests.runner_checks import hf_logits, logits_of, prompt

MOE = RunnerConfig(device="cpu", architecture="qwen3_moe")


@pytest.fixture(scope="module")
def model():
    """The tiny Qwen3-MoE model with its norms' weights drawn away from 1: with all-ones weights, q_norm
    commutes with the rotary embedding (a rotation keeps the RMS), and normalising after it would pass."""
    m = copy.deepcopy(load_model(MOE))
    gen = torch.Generator().manual_seed(0)
    for name, p in m.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1 + 0.5 * torch.randn(p.shape, generator=gen))
    return m


def test_the_tiny_moe_model_is_qwen3_moe_sparse_everywhere_and_cached_apart_from_qwen2():
    m = load_model(MOE)
    c = m.config
    assert type(m).__name__ == "Qwen3MoeForCausalLM" and c.head_dim == 16 and c.sliding_window is None
    assert all(type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock" for layer in m.model.layers)
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (8, 2, 64)
    assert not c.tie_word_embeddings
    check_runner_model(str(model_dir(MOE)))  # a checkpoint `runner.model_path` may name
    # qwen2's cache key is the one it had before the architecture field: existing entries stay valid
    old_key = json.dumps([64, 2, 4, 2, 256, 8192, 0])
    assert model_dir(RunnerConfig()).name == f"tiny-qwen2-{hashlib.sha1(old_key.encode()).hexdigest()[:12]}"
    moe_fields = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
    keyed = {model_dir(RunnerConfig(architecture="qwen3_moe", **{f: 4})) for f in moe_fields}
    assert len(keyed | {model_dir(MOE), model_dir(RunnerConfig())}) == 5


def test_prefill_matches_hf_forward_logits_kv_and_router_choices(model):
    p = prompt(150)
    with torch.inference_mode():
        out = model(torch.tensor([p]), use_cache=True, output_router_logits=True)
    runner = ModelRunner(model, num_blocks=16, block_size=16)
    with logits_of(runner) as steps:
        (token,) = runner.execute([RunnerInput("a", p, 0, list(range(10)), 160, True)])
    torch.testing.assert_close(steps[0][0], out.logits[0, -1], atol=1e-4, rtol=1e-4)
    assert token == int(out.logits[0, -1].argmax())
    kv = runner.read_kv(list(range(10)), 150)
    for layer in range(model.config.num_hidden_layers):
        np.testing.assert_allclose(kv[layer, 0], out.past_key_values.layers[layer].keys[0].numpy(), atol=1e-5)
        np.testing.assert_allclose(
            kv[layer, 1], out.past_key_values.layers[layer].values[0].numpy(), atol=1e-5
        )
    top_k = model.config.num_experts_per_tok
    for layer, router_logits in enumerate(out.router_logits):  # the experts HF's router chose
        chosen = router_logits.topk(top_k, dim=-1).indices.flatten()
        np.testing.assert_array_equal(runner.last_expert_counts[layer], np.bincount(chosen, minlength=8))
    assert (runner.last_expert_counts > 0).sum() >= 12  # the router spreads tokens over the experts


def test_chunked_prefill_after_a_cached_prefix_matches_hf_forward(model):
    """b hits a's first 96 tokens (6 blocks) in the pool and computes the rest in two chunks, the first
    batched with another request's prefill."""
    p = prompt(200, 1)
    runner = ModelRunner(model, num_blocks=64, block_size=16)
    runner.execute([RunnerInput("a", p[:100], 0, list(range(7)), 101, False)])
    runner.release("a")
    b_blocks = [*range(6), *range(20, 27)]
    with logits_of(runner) as steps:
        runner.execute(
            [
                RunnerInput("b", p[96:150], 96, b_blocks, 201, False),
                RunnerInput("c", prompt(30, 2), 0, [40, 41], 31, True),
            ]
        )
        (token,) = runner.execute([RunnerInput("b", p[150:], 150, b_blocks, 201, True)])
    torch.testing.assert_close(steps[0][0], hf_logits(model, prompt(30, 2))[-1], atol=1e-4, rtol=1e-4)
    ref = hf_logits(model, p)[-1]
    torch.testing.assert_close(steps[1][0], ref, atol=1e-4, rtol=1e-4)
    assert token == int(ref.argmax())


def test_batched_decodes_emit_hf_greedy_tokens(model):
    """Three requests prefilled apart, then decoding together step by step: every step's logits are
    those of HF's forward over the whole sequence so far (no cache)."""
    runner = ModelRunner(model, num_blocks=32, block_size=16)
    seqs = {f"r{i}": prompt(n, 10 + i) for i, n in enumerate((17, 40, 63))}
    blocks = {rid: list(range(8 * i, 8 * i + 6)) for i, rid in enumerate(seqs)}
    for rid, s in seqs.items():
        (tok,) = runner.execute([RunnerInput(rid, s, 0, blocks[rid], 80, True)])
        seqs[rid] = [*s, tok]
    for _ in range(6):
        items = [RunnerInput(rid, s[-1:], len(s) - 1, blocks[rid], 80, True) for rid, s in seqs.items()]
        with logits_of(runner) as steps:
            tokens = runner.execute(items)
        refs = torch.stack([hf_logits(model, s)[-1] for s in seqs.values()])
        torch.testing.assert_close(steps[0], refs, atol=1e-4, rtol=1e-4)
        assert tokens == refs.argmax(-1).tolist()
        assert runner.last_expert_counts.sum(axis=1).tolist() == [3 * 2] * 2  # 3 tokens, top 2, per layer
        seqs = {rid: [*s, tok] for (rid, s), tok in zip(seqs.items(), tokens, strict=True)}
    for rid in seqs:
        runner.release(rid)
    runner.assert_empty()


def test_a_dense_runner_counts_no_experts():
    runner = ModelRunner(load_model(RunnerConfig(device="cpu")), num_blocks=4, block_size=16)
    runner.warm_up()
    assert runner.last_expert_counts is None


MOE_GREEDY = {
    "runner": {"compute": "real", "device": "cpu", "architecture": "qwen3_moe"},
    "workload": {"output_policy": "greedy"},
}


def test_pd_with_the_moe_runner_emits_the_collocated_greedy_tokens():
    """Virtual time: the same greedy tokens on both designs, and not the dense model's (the MoE model ran)."""
    prompts = make_requests(8, [1, 16, 17, 40, 75, 110, 150, 200], 10, seed=7, gap_s=0.3)
    colo, _ = run_requests(make_config(COLLOCATED, MOE_GREEDY), prompts)
    pd, _ = run_requests(make_config(PD, MOE_GREEDY), prompts)
    assert [r.finished_reason for r in colo + pd] == ["length"] * 16
    assert [r.output_token_ids for r in pd] == [r.output_token_ids for r in colo]
    dense, _ = run_requests(make_config(COLLOCATED, MOE_GREEDY, runner={"architecture": "qwen2"}), prompts)
    assert sum(a.output_token_ids != b.output_token_ids for a, b in zip(colo, dense, strict=True)) >= 7


def test_an_unsupported_architecture_is_refused_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MixtralForCausalLM"]}))
    with pytest.raises(UnsupportedModelError) as e:
        load_model(RunnerConfig(device="cpu", model_path=str(tmp_path)))  # refused before any weights
    assert str(e.value) == (
        f"runner.model_path={str(tmp_path)!r}: architecture MixtralForCausalLM is not supported by the "
        "runner; allowed: Qwen2ForCausalLM, Qwen3MoeForCausalLM, NemotronHForCausalLM"
    )
