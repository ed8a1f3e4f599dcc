"""The hybrid runner with the tiny Nemotron-H model (Mamba2, attention, MoE and MLP layers): its packed
forward, the Mamba2 state carried from step to step, equals the model's own forward; a P/D handoff of
the KV and the state as of N-1 prompt tokens emits collocated's greedy tokens, one of the state as of N
(its last token then applied twice) does not."""

import hashlib
import json

import numpy as np
import pytest
import torch

from actors.engine.runner.arch import check_runner_model
from actors.engine.runner.hybrid import HybridRunner
from actors.engine.runner.model_runner import RunnerInput
from actors.engine.runner.tiny_model import load_model, model_dir
from emulation.config import RunnerConfig
from messages import SsmState
from tests.runner_checks import hf_logits, logits_of, prompt

HYBRID = RunnerConfig(
    device="cpu",
    architecture="nemotron_h",
    vocab_size=128,
    intermediate_size=96,
    num_experts=4,
    moe_intermediate_size=32,
)
BS = 4  # tokens a block: every prompt spans several
N = 15


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TESTBED_CACHE", str(tmp_path_factory.mktemp("cache")))
        return load_model(HYBRID)


def hf_greedy(model, tokens, n):
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([tokens]), max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True
        )
    return out[0, len(tokens) :].tolist()


def assert_state_close(actual, expected):
    """Within float32 rounding of the largest entry (the tiny model's recurrent states are ~1e-5)."""
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def relative_difference(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def run(runner, rid, chunks, blocks, decodes, **first):
    """A request's prompt `chunks` (from `first`'s start_pos, 0 by default) one step each, then `decodes`
    greedy tokens; returns the tokens. `first`: the first step's extra RunnerInput fields."""
    start = first.pop("start_pos", 0)
    cap = start + sum(map(len, chunks)) + decodes
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        extra = first if i == 0 else {}
        (tok,) = runner.execute([RunnerInput(rid, chunk, start, blocks, cap, last, **extra)])
        start += len(chunk)
    tokens = [tok]
    for _ in range(decodes - 1):
        (tok,) = runner.execute([RunnerInput(rid, [tokens[-1]], start, blocks, cap, True)])
        tokens.append(tok)
        start += 1
    return tokens


def test_the_tiny_hybrid_model_is_nemotron_h_in_the_pattern_s_layers_and_cached_apart(model):
    names = {"M": "Mamba2Mixer", "*": "Attention", "E": "MoE", "-": "MLP"}
    kinds = [type(layer.mixer).__name__ for layer in model.model.layers]
    assert kinds == [f"NemotronH{names[c]}" for c in HYBRID.hybrid_override_pattern]
    assert model.dtype == torch.float32 and model.model.layers[0].mixer.conv1d.kernel_size == (4,)
    check_runner_model(model.name_or_path)  # the directory it loaded from: `runner.model_path` may name it
    # qwen3_moe's cache key is the one it had before nemotron_h's fields
    old = json.dumps([64, 2, 4, 2, 256, 8192, 0, "qwen3_moe", 8, 2, 64, "norm_topk_prob"])
    moe = model_dir(RunnerConfig(architecture="qwen3_moe"))
    assert moe.name == f"tiny-qwen3_moe-{hashlib.sha1(old.encode()).hexdigest()[:12]}"
    keyed = {
        model_dir(RunnerConfig(architecture="nemotron_h", **{f: 2})) for f in ("conv_kernel", "chunk_size")
    }
    assert len(keyed | {model_dir(RunnerConfig(architecture="nemotron_h"))}) == 3


def test_prompt_whole_or_in_chunks_matches_hf_forward_state_and_greedy_generate(model):
    """Chunks of 5, 7 and 3 tokens cross the mixer's scan chunks (8) and continue from the state the
    last step left; the state saved after the prompt is the model's own cache's (less the conv input
    no later output reads)."""
    p = prompt(N, 0, vocab=128)
    with torch.inference_mode():
        out = model(torch.tensor([p]), use_cache=True)
    expected = hf_greedy(model, p, 6)
    for chunks in ([p], [p[:5], p[5:12], p[12:]]):
        runner = HybridRunner(model, num_blocks=16, block_size=BS)
        with logits_of(runner) as steps:
            tokens = run(runner, "a", chunks, [3, 4, 5, 6, 7, 8], 6)
        torch.testing.assert_close(steps[0][0], out.logits[0, -1], atol=1e-5, rtol=1e-5)
        assert tokens == expected
        runner.release("a")
        runner.assert_empty()
    runner = HybridRunner(model, num_blocks=16, block_size=BS)
    runner.execute([RunnerInput("b", p[:9], 0, [4, 5, 6, 7], N, False)])
    runner.execute([RunnerInput("b", p[9:], 9, [4, 5, 6, 7], N, False, state_block=7)])
    state = runner.read_state(7)
    assert state.nbytes == runner.state_bytes and not state.conv.flags.writeable
    for i, li in enumerate(runner.ssm_layers):
        layer = out.past_key_values.layers[li]
        assert_state_close(state.conv[i], layer.conv_states[0][0, :, 1:].T.numpy())
        assert_state_close(state.ssm[i], layer.recurrent_states[0][0].numpy())


def test_batched_prefills_and_decodes_of_different_lengths_match_hf_forward(model):
    """Two prompts of 11 and 19 tokens in one step, then their decodes together, step by step: every
    step's logits are those of HF's forward over the whole sequence so far (no cache)."""
    runner = HybridRunner(model, num_blocks=32, block_size=BS)
    runner.warm_up()
    seqs = {"r0": prompt(11, 1, vocab=128), "r1": prompt(19, 2, vocab=128)}
    blocks = {"r0": list(range(0, 6)), "r1": list(range(10, 17))}
    done = dict.fromkeys(seqs, 0)
    with logits_of(runner) as steps:
        for _ in range(5):
            items = [RunnerInput(r, s[done[r] :], done[r], blocks[r], 26, True) for r, s in seqs.items()]
            tokens = runner.execute(items)
            for (r, s), tok, row in zip(seqs.items(), tokens, steps[-1], strict=True):
                ref = hf_logits(model, s)[-1]
                torch.testing.assert_close(row, ref, atol=1e-5, rtol=1e-5)
                assert tok == int(ref.argmax())
                done[r] = len(s)
                s.append(tok)
    runner.release("r0")
    runner.release("r1")
    runner.assert_empty()


def test_a_request_resuming_on_a_state_saved_in_the_same_step_runs_after_it(model):
    """b's KV prefix is in the pool already; its state is the one a saves in this step: b waits for it."""
    p = prompt(12, 3, vocab=128)
    runner = HybridRunner(model, num_blocks=16, block_size=BS)
    runner.execute([RunnerInput("kv", p[:8], 0, [2, 3], 8, False)])
    runner.release("kv")
    with logits_of(runner) as steps:
        runner.execute(
            [
                RunnerInput("a", p[:8], 0, [0, 1], 8, False, state_block=9),
                RunnerInput("b", p[8:], 8, [2, 3, 4], 12, True, state_source_block=9),
            ]
        )
    torch.testing.assert_close(steps[0][0], hf_logits(model, p)[-1], atol=1e-5, rtol=1e-5)
    with pytest.raises(LookupError, match=r"request 'c' resumes at token 8 with no SSM state"):
        runner.execute([RunnerInput("c", p[8:], 8, [2, 3, 4], 12, True, state_source_block=5)])


def state_as_of(model, tokens):
    runner = HybridRunner(model, num_blocks=16, block_size=BS)
    runner.execute(
        [RunnerInput("s", tokens, 0, list(range(-(-len(tokens) // BS))), len(tokens), False, state_block=0)]
    )
    return runner.read_state(0)


def handoff(model, computed, kv_tokens, decodes):
    """P computes the prompt's first `computed` tokens and saves the state after them; D receives the KV
    of the first `kv_tokens` and that state, computes the rest of the prompt from token `kv_tokens` on
    (saving its state after that step) and decodes greedily. Returns D's tokens, the state P sent and
    D's state after the prompt."""
    p = prompt(N, 7, vocab=128)
    prefill = HybridRunner(model, num_blocks=16, block_size=BS)
    prefill.execute([RunnerInput("r", p[:computed], 0, [0, 1, 2, 3], computed, False, state_block=3)])
    kv, sent = prefill.read_kv([0, 1, 2, 3], kv_tokens), prefill.read_state(3)
    decode = HybridRunner(model, num_blocks=16, block_size=BS)
    d_blocks = [8, 9, 10, 11, 12, 13]
    decode.write_kv(d_blocks, kv)
    decode.write_state(11, SsmState(sent.conv.copy(), sent.ssm.copy()))  # as it arrives: another array
    tokens = run(
        decode,
        "r",
        [p[kv_tokens:]],
        d_blocks,
        decodes,
        start_pos=kv_tokens,
        state_source_block=11,
        state_block=12,
    )
    decode.release("r")
    decode.assert_empty()
    return tokens, sent, decode.read_state(12)


def test_pd_handoff_of_state_and_kv_at_n_minus_1_emits_collocated_tokens(model):
    p = prompt(N, 7, vocab=128)
    tokens, sent, after = handoff(model, N - 1, N - 1, 8)
    assert tokens == hf_greedy(model, p, 8)
    assert_state_close(sent.ssm, state_as_of(model, p[:-1]).ssm)
    as_of_n = state_as_of(model, p)
    assert_state_close(after.ssm, as_of_n.ssm)
    assert_state_close(after.conv, as_of_n.conv)


def test_pd_handoff_of_the_state_as_of_n_applies_the_last_token_twice_and_diverges(model):
    """The state as of all N tokens with the KV of N-1: D recomputes token N on top, so its state has
    seen that token twice; its attention's KV is right, its state and greedy tokens are not."""
    p = prompt(N, 7, vocab=128)
    tokens, sent, after = handoff(model, N, N - 1, 8)
    as_of_n = state_as_of(model, p)
    assert_state_close(sent.ssm, as_of_n.ssm)
    # token N twice: the conv window one input on (the last twice), the recurrent state well off
    assert relative_difference(after.conv, as_of_n.conv) > 0.5
    assert relative_difference(after.ssm, as_of_n.ssm) > 0.1
    assert tokens != hf_greedy(model, p, 8)
