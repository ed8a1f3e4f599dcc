"""The runner on a GPU (skipped where none is visible): same math as the model's forward, and P/D
still emits the collocated greedy tokens with its KV moving through host memory."""

import numpy as np
import pytest
import torch

from actors.engine.runner.model_runner import ModelRunner, RunnerInput
from actors.engine.runner.tiny_model import load_model
from emulation.config import RunnerConfig
from tests.factories import COLLOCATED, PD, make_config, make_requests, run_requests

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU visible")
CUDA = {"runner": {"compute": "real", "device": "cuda"}, "workload": {"output_policy": "greedy"}}


def test_runner_on_gpu_matches_the_model_forward():
    model = load_model(RunnerConfig(device="cuda"))
    assert next(model.parameters()).is_cuda
    prompt = torch.randint(0, 8192, (500,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.inference_mode():
        out = model(torch.tensor([prompt], device="cuda"), use_cache=True)
    runner = ModelRunner(model, num_blocks=64, block_size=16)
    blocks = list(range(32))
    runner.execute([RunnerInput("a", prompt[:200], 0, blocks, 510, False)])
    (token,) = runner.execute([RunnerInput("a", prompt[200:], 200, blocks, 510, True)])
    assert token == int(out.logits[0, -1].argmax())
    kv = runner.read_kv(blocks, 500)
    for layer in range(model.config.num_hidden_layers):
        ref = out.past_key_values.layers[layer].keys[0].cpu().numpy()
        np.testing.assert_allclose(kv[layer, 0], ref, atol=1e-4)


def test_pd_on_gpu_emits_the_collocated_greedy_tokens():
    reqs = make_requests(12, [60 + 31 * i for i in range(12)], 10, seed=3, gap_s=0.2)
    colo, _ = run_requests(make_config(COLLOCATED, CUDA), reqs)
    pd, dep = run_requests(make_config(PD, CUDA), reqs)
    assert all(e.executor.runner is not None and e.executor.runner.device.type == "cuda" for e in dep.engines)
    assert [r.output_token_ids for r in pd] == [r.output_token_ids for r in colo]
    assert all(r.finished_reason == "length" for r in pd)
