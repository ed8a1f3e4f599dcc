"""The runner's paged, packed forward equals the transformers model's own forward."""

import copy

import numpy as np
import pytest
import torch

from actors.engine.runner.model_runner import ModelRunner, RunnerInput
from actors.engine.runner.tiny_model import load_model, model_dir
from emulation.config import RunnerConfig
from tests.runner_checks import prompt


@pytest.fixture(scope="module")
def model():
    return load_model(RunnerConfig(device="cpu"))


def test_model_is_loaded_from_a_local_directory(model, tmp_path, monkeypatch):
    """The weights are the directory's: built from the seed where it is missing, and a changed
    checkpoint (`runner.model_path`) loads changed."""
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path / "cache"))
    fresh = load_model(RunnerConfig(device="cpu"))
    assert model_dir(RunnerConfig()).is_relative_to(tmp_path) and fresh is not model
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), model.parameters(), strict=True))
    edited = copy.deepcopy(model)
    edited.lm_head.weight.mul_(2)
    edited.save_pretrained(tmp_path / "edited")
    loaded = load_model(RunnerConfig(device="cpu", model_path=str(tmp_path / "edited")))
    assert torch.equal(loaded.lm_head.weight, 2 * model.lm_head.weight)


def test_chunked_batched_forward_matches_hf_forward(model):
    p = prompt(300)
    with torch.inference_mode():
        out = model(torch.tensor([p]), use_cache=True)
    ref_token = int(out.logits[0, -1].argmax())
    runner = ModelRunner(model, num_blocks=64, block_size=16)
    blocks = list(range(19))
    other = list(range(30, 34))
    # three chunks, the middle one batched with another request's prefill
    runner.execute([RunnerInput("a", p[:100], 0, blocks, 310, False)])
    runner.execute(
        [
            RunnerInput("a", p[100:250], 100, blocks, 310, False),
            RunnerInput("b", prompt(50, 1), 0, other, 60, True),
        ]
    )
    (token,) = runner.execute([RunnerInput("a", p[250:], 250, blocks, 310, True)])
    assert token == ref_token
    kv = runner.read_kv(blocks, 300)
    for layer in range(model.config.num_hidden_layers):
        np.testing.assert_allclose(kv[layer, 0], out.past_key_values.layers[layer].keys[0].numpy(), atol=1e-5)
        np.testing.assert_allclose(
            kv[layer, 1], out.past_key_values.layers[layer].values[0].numpy(), atol=1e-5
        )
    runner.release("a")
    runner.release("b")
    runner.assert_empty()


def test_kv_written_to_other_blocks_continues_identically(model):
    p = prompt(80, 3)
    src = ModelRunner(model, num_blocks=32, block_size=16)
    src.execute([RunnerInput("a", p, 0, [0, 1, 2, 3, 4], 90, True)])
    dst = ModelRunner(model, num_blocks=32, block_size=16)
    dst.write_kv([9, 8, 7, 6, 5], src.read_kv([0, 1, 2, 3, 4], 80))
    a = src.execute([RunnerInput("a", [5], 80, [0, 1, 2, 3, 4, 10], 90, True)])
    b = dst.execute([RunnerInput("x", [5], 80, [9, 8, 7, 6, 5, 10], 90, True)])
    assert a == b


def test_a_prefix_hit_on_blocks_the_same_step_computes_reads_them_computed(model):
    """The scheduler caches blocks as it schedules them (vLLM's rule), so a request admitted later in
    a step may hit blocks an earlier one computes in that very step: it still sees their KV."""
    p = prompt(40, 3)
    with torch.inference_mode():
        ref_token = int(model(torch.tensor([p])).logits[0, -1].argmax())
    runner = ModelRunner(model, num_blocks=16, block_size=16)
    first = RunnerInput("first", p, 0, [0, 1, 2], 41, True)
    hit = RunnerInput("hit", p[32:], 32, [0, 1, 5], 41, True)  # blocks 0 and 1: first's, hit
    assert runner.execute([first, hit]) == [ref_token, ref_token]
