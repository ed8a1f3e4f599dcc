"""The runner model's tokenizer: a byte-level BPE the project trains itself, with a ChatML chat template.

No hub is reachable, so the tokenizer is trained (once, cached like the runner model) with `tokenizers`
on text generated here from a seed, wrapped as a `transformers` `PreTrainedTokenizerFast`, and saved and
loaded with `save_pretrained` / `from_pretrained`. Any local Hugging Face tokenizer directory can replace
it (`render.tokenizer_path`). The template follows Qwen3's ChatML: system/user/assistant/tool roles, tool
definitions in the system turn, `<tool_call>{json}</tool_call>`, and `<think>...</think>` reasoning that
is dropped from assistant turns before the last user turn (`keep_past_reasoning=True` keeps it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
]
EOS_TOKEN = "<|im_end|>"
_CORPUS_VERSION = 2
"""Bump when the corpus or the template changes: it is part of the cache key."""

CHAT_TEMPLATE = """\
{#- transformers renders with trim_blocks and lstrip_blocks: a newline right after a block tag is
    dropped, so line breaks that must survive are written as {{ nl }}. -#}
{%- set nl = '\n' -%}
{#- a message's content: text, or parts (an image is one pad, widened by the render tier) -#}
{%- macro text_of(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is not none -%}{%- for part in content -%}
{%- if part.type == 'text' -%}{{ part.text }}
{%- elif part.type in ('image', 'image_url') -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}
{%- endif -%}{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- set keep = keep_past_reasoning is defined and keep_past_reasoning -%}
{%- if tools -%}
{{ '<|im_start|>system' + nl }}
{%- if messages[0].role == 'system' %}{{ text_of(messages[0].content) + nl + nl }}{% endif -%}
{{ '# Tools' + nl + nl + 'You may call one or more functions to assist with the user query.' + nl + nl }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:' + nl + '<tools>' + nl }}
{%- for tool in tools %}{{ tool | tojson + nl }}{% endfor -%}
{{ '</tools>' + nl + nl + 'For each function call, return a json object with function name and arguments '
   + 'within <tool_call></tool_call> XML tags:' + nl + '<tool_call>' + nl
   + '{"name": <function-name>, "arguments": <args-json-object>}' + nl + '</tool_call><|im_end|>' + nl }}
{%- elif messages[0].role == 'system' -%}
{{ '<|im_start|>system' + nl + text_of(messages[0].content) + '<|im_end|>' + nl }}
{%- endif -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for message in messages -%}
{%- if message.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif -%}
{%- endfor -%}
{%- for message in messages -%}
{%- if message.role == 'system' and loop.first -%}
{%- elif message.role == 'user' or message.role == 'system' -%}
{{ '<|im_start|>' + message.role + nl + text_of(message.content) + '<|im_end|>' + nl }}
{%- elif message.role == 'assistant' -%}
{%- set content = text_of(message.content) -%}
{%- set reasoning = message.reasoning_content or '' -%}
{%- if '</think>' in content -%}
{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
{%- set content = content.split('</think>')[-1] -%}
{%- endif -%}
{#- as Qwen3's: a reasoning parser's reasoning_content keeps the newlines around it -#}
{%- set reasoning = reasoning.strip(nl) -%}
{%- set content = content.lstrip(nl) -%}
{{ '<|im_start|>assistant' + nl }}
{%- if reasoning and (keep or loop.index0 > ns.last_user) -%}
{{ '<think>' + nl + reasoning + nl + '</think>' + nl + nl }}
{%- endif -%}
{{ content }}
{%- for call in message.tool_calls or [] -%}
{%- set fn = call.function if call.function is defined else call -%}
{%- set args = fn.arguments if fn.arguments is string else fn.arguments | tojson -%}
{%- if content or not loop.first %}{{ nl }}{% endif -%}
{{ '<tool_call>' + nl + '{"name": "' + fn.name + '", "arguments": ' + args + '}' + nl + '</tool_call>' }}
{%- endfor -%}
{{ '<|im_end|>' + nl }}
{%- elif message.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif -%}
{{ nl + '<tool_response>' + nl + text_of(message.content) + nl + '</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>' + nl }}{% endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<|im_start|>assistant' + nl }}
{%- if enable_thinking is defined and enable_thinking is false -%}
{{ '<think>' + nl + nl + '</think>' + nl + nl }}
{%- endif -%}
{%- endif -%}
"""

_WORDS = """the a an of to in and or is are was be by for on with as at from that this it not we you they
request token tokens prompt model engine prefill decode cache block blocks batch step steps time
latency first second last next each every all some many few more less fast slow high low long short
new old server client proxy render stream streaming output input text answer question user assistant
system tool call function name arguments value result error weather city temperature today tomorrow
date number compute memory bandwidth link transfer bytes layer layers head heads attention scheduler
queue waiting running finished length stop abort reason goodput throughput rate seconds milliseconds
percent budget python json list dict string integer float true false null return def class import if
else while loop file path line code test tests check run runs build make install package version
config field value please thanks hello world can could would should will may might must do does did
have has had get got think thinking reason reasoning because therefore so then first finally answer
step plan search read write open close start end begin continue done ok yes no maybe error warning
info debug trace
""".split()
_SYLLABLES = """ka to ri ne mu sa lo pe di gu ba ze mi ro ta ne vo ha ki lu po se fa
""".split()


def training_corpus(seed: int = 0, num_lines: int = 60_000) -> list[str]:
    """Deterministic text: sentences of common and domain words, made-up words, numbers, JSON tool calls,
    code, and chat-formatted turns (so the template's markup tokenizes compactly)."""
    rng = np.random.default_rng(seed)
    words = np.array(_WORDS)
    lines: list[str] = []
    for i in range(num_lines):
        kind = i % 6
        if kind == 0:
            n = int(rng.integers(4, 18))
            sentence = " ".join(words[rng.integers(0, len(words), n)])
            lines.append(sentence.capitalize() + rng.choice([".", "?", "!", ":"]))
        elif kind == 1:
            made_up = ["".join(rng.choice(_SYLLABLES, int(rng.integers(1, 4)))) for _ in range(6)]
            lines.append(" ".join(made_up))
        elif kind == 2:
            lines.append(" ".join(str(int(x)) for x in rng.integers(0, 100_000, int(rng.integers(1, 8)))))
        elif kind == 3:
            args = {str(rng.choice(words)): str(rng.choice(words)), "n": int(rng.integers(0, 1000))}
            call = {"name": f"get_{rng.choice(words)}", "arguments": args}
            lines.append(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")
        elif kind == 4:
            a, b = rng.choice(words, 2)
            lines.append(f"def {a}_{b}(x: int) -> int:\n    return x * {int(rng.integers(2, 99))}")
        else:
            q = " ".join(words[rng.integers(0, len(words), 8)])
            lines.append(
                f"<|im_start|>user\n{q}?<|im_end|>\n<|im_start|>assistant\n<think>\n{q}\n</think>\n\n"
            )
    return lines


def tokenizer_dir(vocab_size: int, cache_dir: str | None = None) -> Path:
    key = hashlib.sha256(f"{_CORPUS_VERSION}:{vocab_size}:{CHAT_TEMPLATE}".encode()).hexdigest()[:12]
    root = Path(cache_dir or os.environ.get("TESTBED_CACHE") or Path.home() / ".cache" / "disagg-testbed")
    return root / f"tokenizer-bpe{vocab_size}-{key}"


def ensure_tokenizer(vocab_size: int, cache_dir: str | None = None) -> Path:
    """Train and save the project's tokenizer unless cached; returns its directory."""
    path = tokenizer_dir(vocab_size, cache_dir)
    if (path / "tokenizer.json").exists():
        return path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
        chat_template=CHAT_TEMPLATE,
    )
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    wrapped.save_pretrained(tmp)
    with contextlib.suppress(OSError):  # a concurrent builder's copy is as good as ours
        tmp.rename(path)
    return path


def load_tokenizer(path: str | None, vocab_size: int) -> Any:
    """A local HF tokenizer directory, or the project's own (trained for `vocab_size` on first use)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path or ensure_tokenizer(vocab_size))
