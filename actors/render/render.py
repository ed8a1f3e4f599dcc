"""The render role: chat requests to token IDs (templates), token IDs back to text, reasoning and tool calls
(incremental detokenization + parsers). GPU-less CPU work, measured per call; engines never see text.

Streaming derender, two ways::

    stateful:   chunk = new token IDs      -> this replica keeps (decoder, parser) per stream: O(new)
    stateless:  chunk = all token IDs + how many were already derendered
                                           -> any replica rebuilds (decoder, parser) and replays the
                                              history, emitting only what the new tokens add: O(all)
                                              decoder steps, each feeding a rescanning parser O(text)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tokenizers.decoders import DecodeStream

from actors.render.images import IMAGE_PAD, ImageError, ProcessedImage, expand_image_pads, process_image
from actors.render.parsers import IncrementalParser, ParsedDelta, PlainParser, RescanningParser
from emulation.vision import vision_encoder_of
from messages import MultiModalItem, RenderedPrompt, RenderSpec

DATE_FORMAT = "%d %b %Y"
"""`date_string` handed to every template (Llama 3.1's format); templates that stamp the date use it."""


@dataclass
class RenderStats:
    num_renders: int = 0
    num_prompt_tokens: int = 0
    render_cpu_s: float = 0.0
    num_derender_calls: int = 0
    num_derendered_tokens: int = 0
    derender_cpu_s: float = 0.0
    num_images: int = 0
    image_cpu_s: float = 0.0
    """Decoding, resizing and hashing images (part of rendering their requests)."""


class _Stream:
    """One output stream's incremental state: the detokenizer and the parser."""

    def __init__(self, tokenizer: Any, parser: IncrementalParser | RescanningParser | PlainParser) -> None:
        self.decoder = DecodeStream(skip_special_tokens=False)
        self.tokenizer = tokenizer
        self.parser = parser

    def feed(self, token_ids: Sequence[int], out: ParsedDelta) -> None:
        for tid in token_ids:
            text = self.decoder.step(self.tokenizer, tid)
            if text:
                out.extend(self.parser.feed(text))


class Render:
    """Stateless apart from open stateful streams; safe to replicate (a pool of render actors)."""

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str | None = None,
        now: Callable[[], datetime] = datetime.now,
        on_render: Callable[[str, float, int], None] | None = None,
        target_model: str | None = None,
    ) -> None:
        """`tokenizer`: a transformers tokenizer; `chat_template` replaces its own; `now` is the clock
        templates read the date from; `on_render(op, cpu_s, num_tokens)` records each call's CPU time
        (op: render | derender | image); `target_model`: the emulated model, whose image processor
        images go through (None or a text-only model: images are refused)."""
        self.tokenizer = tokenizer
        self.target_model = target_model
        self.vision = vision_encoder_of(target_model) if target_model is not None else None
        self.chat_template = chat_template
        self.now = now
        self.on_render = on_render
        self.stats = RenderStats()
        self._backend = tokenizer.backend_tokenizer
        self._stop_ids = {i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None}
        self._streams: dict[str, _Stream] = {}

    @property
    def eos_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    # ---- render ---------------------------------------------------------------------------------------

    def render_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **kwargs: Any
    ) -> list[int]:
        """Messages (OpenAI shape) -> prompt token IDs, through the chat template."""
        start = time.thread_time()
        ids = self.tokenizer.apply_chat_template(
            messages,
            tools=tools or None,
            chat_template=self.chat_template,
            add_generation_prompt=kwargs.pop("add_generation_prompt", True),
            date_string=self.now().strftime(DATE_FORMAT),
            tokenize=True,
            **kwargs,
        )
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        self._rendered(time.thread_time() - start, len(ids))
        return ids

    def render_spec(self, spec: RenderSpec) -> RenderedPrompt:
        """A chat request as sent between roles -> prompt token IDs and its images (decoded, resized
        and hashed here, their placeholders widened to their visual tokens). ImageError names a bad
        image part."""
        start = time.thread_time()
        images = [
            self._image(part["image_url"]["url"], f"messages[{i}].content[{j}]")
            for i, m in enumerate(spec.messages)
            if isinstance(m.get("content"), list)
            for j, part in enumerate(m["content"])
            if part.get("type") == "image_url"
        ]
        image_cpu_s = time.thread_time() - start
        ids = self.render_chat(spec.messages, spec.tools, **spec.template_kwargs)
        if not images:
            return RenderedPrompt(ids)
        pad = self.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
        if not isinstance(pad, int) or pad == self.tokenizer.unk_token_id:
            raise ImageError("messages", f"images need a tokenizer with an {IMAGE_PAD} token")
        ids, offsets = expand_image_pads(ids, pad, images)
        self.stats.num_images += len(images)
        self.stats.image_cpu_s += image_cpu_s
        for im in images:  # decode + process + hash, shared evenly (one call each)
            self._record("image", image_cpu_s / len(images), im.num_tokens)
        items = [
            MultiModalItem(im.mm_hash, at, im.num_tokens, im.pixel_values, im.grid_thw)
            for im, at in zip(images, offsets, strict=True)
        ]
        return RenderedPrompt(ids, items)

    def _image(self, url: str, where: str) -> ProcessedImage:
        if self.vision is None:
            raise ImageError(where, f"images need a vision-language target; {self.target_model!r} is "
                             "text only (e.g. target.model=qwen3-vl-4b)")  # fmt: skip
        return process_image(url, where, self.vision)

    def render_text(self, text: str) -> list[int]:
        """A raw prompt (completions API) -> token IDs, no template."""
        start = time.thread_time()
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        self._rendered(time.thread_time() - start, len(ids))
        return ids

    def _rendered(self, cpu_s: float, num_tokens: int) -> None:
        st = self.stats
        st.num_renders += 1
        st.num_prompt_tokens += num_tokens
        st.render_cpu_s += cpu_s
        self._record("render", cpu_s, num_tokens)

    def _record(self, op: str, cpu_s: float, num_tokens: int) -> None:
        if self.on_render is not None:
            self.on_render(op, cpu_s, num_tokens)

    # ---- derender -------------------------------------------------------------------------------------

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=False))

    def derender(
        self, stream_id: str, new_token_ids: Sequence[int], finished: bool, parse: bool = True
    ) -> list[ParsedDelta]:
        """Stateful: this replica keeps the stream's decoder and parser between chunks (a chunk is an
        engine's batch of tokens: one call, not one per token). Returns what each token adds, so the
        caller can release them one by one; a finishing chunk's last delta carries what the parser held
        back (a chunk without tokens: one delta). `parse=False`: the text as it is, all content."""
        start = time.thread_time()
        stream = self._streams.get(stream_id)
        if stream is None:
            parser = IncrementalParser() if parse else PlainParser()
            stream = self._streams[stream_id] = _Stream(self._backend, parser)
        outs = self._feed_each(stream, new_token_ids)
        if finished:
            outs[-1].extend(stream.parser.finish())
            del self._streams[stream_id]
        self._derendered(time.thread_time() - start, len(new_token_ids))
        return outs

    def derender_stateless(
        self, all_token_ids: Sequence[int], num_done: int, finished: bool, parse: bool = True
    ) -> list[ParsedDelta]:
        """Stateless: rebuild the decoder and a rescanning parser, replay the first `num_done` tokens
        (their output was sent before), and return what each of the rest adds (as `derender`)."""
        start = time.thread_time()
        stream = _Stream(self._backend, RescanningParser() if parse else PlainParser())
        stream.feed(self._text_ids(all_token_ids[:num_done]), ParsedDelta())
        outs = self._feed_each(stream, all_token_ids[num_done:])
        if finished:
            outs[-1].extend(stream.parser.finish())
        self._derendered(time.thread_time() - start, len(all_token_ids) - num_done)
        return outs

    def _feed_each(self, stream: _Stream, token_ids: Sequence[int]) -> list[ParsedDelta]:
        """What each token adds (at least one delta, for a chunk without tokens)."""
        outs = [ParsedDelta() for _ in token_ids] or [ParsedDelta()]
        for tid, out in zip(token_ids, outs, strict=False):
            if tid not in self._stop_ids:
                stream.feed((tid,), out)
        return outs

    def close(self, stream_id: str) -> None:
        """Drop a stateful stream that will not finish (its client went away)."""
        self._streams.pop(stream_id, None)

    def _text_ids(self, token_ids: Sequence[int]) -> list[int]:
        """End-of-sequence tokens end the text; they are not part of it."""
        return [t for t in token_ids if t not in self._stop_ids]

    def _derendered(self, cpu_s: float, num_tokens: int) -> None:
        st = self.stats
        st.num_derender_calls += 1
        st.num_derendered_tokens += num_tokens
        st.derender_cpu_s += cpu_s
        self._record("derender", cpu_s, num_tokens)

    def assert_empty(self) -> None:
        assert not self._streams, f"render: open streams left: {list(self._streams)[:10]}"
