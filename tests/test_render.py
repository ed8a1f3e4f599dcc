"""The render tier: the project's tokenizer and template, parsers, derender both ways, P/D prompt reuse."""

import itertools
import random
from datetime import datetime

import numpy as np
import pytest
from transformers import AutoTokenizer

from actors.engine.clock import Clock
from actors.render.parsers import IncrementalParser, ParsedDelta, RescanningParser, parse_text
from actors.render.render import Render
from actors.render.tokenizer import SPECIAL_TOKENS, ensure_tokenizer, load_tokenizer
from cluster.virtual import build_deployment
from messages import ClientRequest, RenderSpec
from tests.factories import PD, make_config, run_async

VOCAB = 8192
ANSWER = (
    "<think>\nThe user wants the weather.\n</think>\n\nLet me check.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
ARGS = '{"city": "Paris"}'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None, VOCAB)


def test_tokenizer_saves_and_loads_like_any_hf_tokenizer(tokenizer):
    path = ensure_tokenizer(VOCAB)
    again = AutoTokenizer.from_pretrained(path)
    assert len(again) == len(tokenizer) == VOCAB
    for tok in SPECIAL_TOKENS:
        assert len(again.encode(tok, add_special_tokens=False)) == 1, tok
    text = "Tokens move from prefill to decode: 8192 of them!"
    assert again.decode(again.encode(text, add_special_tokens=False)) == text
    assert again.chat_template == tokenizer.chat_template


def test_template_drops_past_reasoning_keeps_tools_and_can_disable_thinking(tokenizer):
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "<think>\nold thought\n</think>\n\nChecking.",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]},
        {"role": "tool", "content": '{"temp": 21}'},
        {"role": "user", "content": "And tomorrow?"},
    ]  # fmt: skip
    text = tokenizer.apply_chat_template(history, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools") and '"name": "get_weather"' in text
    assert "old thought" not in text  # reasoning of a turn before the last user turn is dropped
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>' in text
    assert text.endswith("<|im_start|>assistant\n")
    kept = tokenizer.apply_chat_template(history, tools=TOOLS, tokenize=False, keep_past_reasoning=True)
    assert "<think>\nold thought\n</think>" in kept
    off = tokenizer.apply_chat_template(
        history[:2], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


TEXTS = [
    ANSWER,
    "Plain answer with <b>tags</b> and a < sign.",
    "<think>\nunfinished",
    "text <tool_call>{bad json}</tool_call> more",
    '<think></think>answer<tool_call>\n{"name":"a","arguments":"{}"}\n</tool_call>\n'
    '<tool_call>\n{"name":"b","arguments":{"x":1}}\n</tool_call>',
    "<thin",
    'x<tool_call>{"name": "open"',
    'x<tool_call>{"name": "write", "arguments": {"path": "a.py", "text": "def f(): return {1',  # cut short
    '<tool_call> {"name":"b", "arguments": {"x": {"y": "}"} } }\n</tool_call>tail',
]


@pytest.mark.parametrize("text", TEXTS)
def test_both_parsers_agree_with_the_whole_text_parse_however_it_is_split(text):
    rng = random.Random(0)
    full = parse_text(text, final=True)
    for _ in range(30):
        for parser in (IncrementalParser(), RescanningParser()):
            out, i = ParsedDelta(), 0
            while i < len(text):
                n = rng.randint(1, 6)
                out.extend(parser.feed(text[i : i + n]))
                i += n
            out.extend(parser.finish())
            assert out == full


@pytest.mark.parametrize("parser", [IncrementalParser, RescanningParser])
def test_tool_call_arguments_stream_as_the_model_writes_them(parser):
    """As vLLM streams them: the name once the header is complete, then argument pieces, before the
    call's end tag arrives; only a brace that may close the call itself is held back."""
    p = parser()
    header = '<tool_call>\n{"name": "write_file", "arguments": '
    args = '{"path": "a.py", "text": "x = {1: 2}"}'
    assert not p.feed(header).tool_calls  # the arguments' first brace is not here yet
    first = p.feed(args[:10]).tool_calls
    assert [(c.name, c.arguments, c.index) for c in first] == [("write_file", args[:10], 0)]
    pieces = [p.feed(ch).tool_calls for ch in args[10:] + "}\n"]
    assert all(c.name == "" and c.index == 0 for piece in pieces for c in piece)
    assert (
        args[:10] + "".join(c.arguments for piece in pieces for c in piece) == args
    )  # the closing brace held
    assert not p.feed("</tool_call>").tool_calls


def test_answer_parses_into_reasoning_content_and_a_tool_call():
    parsed = parse_text(ANSWER, final=True)
    assert parsed.reasoning_content == "The user wants the weather.\n"
    assert parsed.content == "Let me check.\n"
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_weather", '{"city": "Paris"}')]


def test_stateful_and_stateless_derender_give_the_same_stream(tokenizer):
    render = Render(tokenizer)
    ids = [*tokenizer.encode(ANSWER, add_special_tokens=False), render.eos_token_id]
    stateful, stateless = ParsedDelta(), ParsedDelta()
    for i in range(len(ids)):
        last = i == len(ids) - 1
        (delta,) = render.derender("s", ids[i : i + 1], last)
        stateful.extend(delta)
        (delta,) = render.derender_stateless(ids[: i + 1], i, last)
        stateless.extend(delta)
    assert stateful == stateless == parse_text(ANSWER, final=True)
    render.assert_empty()
    assert render.stats.num_derendered_tokens == 2 * len(ids) and render.stats.derender_cpu_s > 0


def test_a_batch_derenders_to_one_delta_per_token_as_if_fed_one_by_one(tokenizer):
    """Engines stream batches; the front end releases a batch's tokens one by one at their stamps."""
    render = Render(tokenizer)
    ids = [*tokenizer.encode(ANSWER, add_special_tokens=False), render.eos_token_id]
    one_by_one = [render.derender("a", [t], i == len(ids) - 1)[0] for i, t in enumerate(ids)]
    rng = np.random.default_rng(1)
    cuts = [0, *sorted(rng.choice(np.arange(1, len(ids)), 6, replace=False).tolist()), len(ids)]
    batched = []
    for lo, hi in itertools.pairwise(cuts):
        batched += render.derender("b", ids[lo:hi], hi == len(ids))
    assert batched == one_by_one
    assert render.derender("c", [], True) == [ParsedDelta()]
    render.assert_empty()


def test_sampled_ids_do_not_survive_a_text_round_trip(tokenizer):
    """Why engines speak token IDs: a sampled sequence, detokenized and tokenized again, is another one."""
    rng = np.random.default_rng(0)
    sampled = rng.integers(len(SPECIAL_TOKENS), VOCAB, 40).tolist()
    again = tokenizer.encode(tokenizer.decode(sampled), add_special_tokens=False)
    assert again != sampled


DATED = "<|im_start|>system\nToday is {{ date_string }}.<|im_end|>\n{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"  # noqa: E501


def _clock_across_midnight():
    times = iter([datetime(2026, 11, 29, 23, 59, 59), datetime(2026, 11, 30, 0, 0, 1)])
    return lambda: next(times)


def test_rendering_twice_across_midnight_gives_other_tokens_of_the_same_length(tokenizer):
    render = Render(tokenizer, DATED, now=_clock_across_midnight())
    chat = [{"role": "user", "content": "hello"}]
    before, after = render.render_chat(chat), render.render_chat(chat)
    assert len(before) == len(after) and before != after


@pytest.mark.parametrize("reuse", [True, False])
def test_decode_reuses_prefill_prompt_ids_unless_it_must_render_again(tokenizer, reuse):
    render = Render(tokenizer, DATED, now=_clock_across_midnight())
    spec = RenderSpec([{"role": "user", "content": "hello"}])
    cfg = make_config(PD, runner={"compute": "skip"}, workload={"prompt_len": 64, "output_len": 4})

    async def rerender(s):
        return render.render_chat(s.messages)

    async def main():
        dep = build_deployment(cfg, Clock(), render=rerender)
        decode = next(e for e in dep.engines if e.role == "decode")
        seen = []
        original = decode.generate
        decode.generate = lambda req: (seen.append(req.prompt_token_ids), original(req))[1]
        for e in dep.engines:
            e.start()
        prompt = await rerender(spec)
        creq = ClientRequest("r", 0.0, prompt, 4, [5, 6, 7, 8], render=spec, reuse_prompt_token_ids=reuse)
        result = await dep.proxy.submit(creq)
        await dep.drain()
        return prompt, seen[0], result

    prompt, decode_prompt, result = run_async(main())
    assert result.finished_reason == "length" and result.output_token_ids == [5, 6, 7, 8]
    if reuse:
        assert decode_prompt == prompt
    else:  # rendered again after midnight: same length, other tokens than the KV it received
        assert len(decode_prompt) == len(prompt) and decode_prompt != prompt
