"""Images in chat requests: Qwen2.5-VL's and Qwen3-VL's resize rules, data URLs only, hashes from
pixels, visual tokens in the prompt, and block hashes that tell two images apart."""

import base64
import io

import numpy as np
import pytest
from PIL import Image

from actors.engine.kv_cache.block_hash import hash_blocks
from actors.render.client import render_for
from actors.render.images import ImageError, process_image
from emulation.vision_encoders import VISION_ENCODERS
from messages import MultiModalItem, RenderSpec
from tests.factories import make_config

QWEN25_VL, QWEN3_VL = VISION_ENCODERS["qwen2.5-vl-vit-7b"], VISION_ENCODERS["qwen3-vl-vit-4b"]


def data_url(image: Image.Image, fmt: str = "PNG") -> str:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def picture(seed: int, size: tuple[int, int] = (448, 448)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


@pytest.mark.parametrize(
    ("size", "grid", "num_tokens"),
    [
        ((448, 448), (1, 32, 32), 256),  # 32 x 32 patches of 14 pixels, merged 2 x 2
        ((1024, 1024), (1, 70, 70), 1225),  # 1036^2 would be 1,369 tokens: over the 1,280 cap
        ((10, 10), (1, 4, 4), 4),  # up to min_pixels (56 x 56)
        ((640, 480), (1, 34, 46), 17 * 23),  # (height, width): 476 x 644
    ],
)
def test_images_are_processed_as_qwen2_5_vl_does(size, grid, num_tokens):
    image = process_image(data_url(picture(0, size)), "part", QWEN25_VL)
    assert image.grid_thw == grid and image.num_tokens == num_tokens
    assert image.pixel_values.shape == (grid[1] * grid[2], 3 * 2 * 14 * 14)


@pytest.mark.parametrize(
    ("size", "grid", "num_tokens"),
    [
        ((448, 448), (1, 28, 28), 196),  # 16-pixel patches: one visual token per 32 x 32
        ((100, 100), (1, 16, 16), 64),  # up to min_pixels (256 x 256)
        ((2048, 1024), (1, 64, 128), 2048),  # (height, width); Qwen2.5-VL's cap would be 1,280
    ],
)
def test_images_are_processed_as_qwen3_vl_does(size, grid, num_tokens):
    image = process_image(data_url(picture(0, size)), "part", QWEN3_VL)
    assert image.grid_thw == grid and image.num_tokens == num_tokens
    assert image.pixel_values.shape == (grid[1] * grid[2], 3 * 2 * 16 * 16)


def test_the_hash_comes_from_the_pixels():
    a, b = picture(1), picture(2)

    def hash_of(image, where="x"):
        return process_image(data_url(image), where, QWEN25_VL).mm_hash

    assert hash_of(a) == hash_of(a, "y") and hash_of(a) != hash_of(b)
    assert process_image(data_url(a, "JPEG"), "x", QWEN25_VL).num_tokens == 256


BAD_IMAGES = [
    ("https://example.com/cat.png", "only data URLs"),
    ("data:text/plain;base64,aGk=", "expected data:image/<format>;base64"),
    ("data:image/png;base64,@@@", "not valid base64"),
    ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "not a decodable image"),
    (data_url(picture(0, (64, 64)), "GIF"), "GIF images are not accepted"),
    (data_url(Image.new("1", (9000, 9000))), "too large"),
    (data_url(Image.new("RGB", (4000, 10))), "aspect ratio"),
]


@pytest.mark.parametrize(("url", "message"), BAD_IMAGES)
def test_bad_images_are_refused_naming_the_part(url, message):
    with pytest.raises(ImageError, match=message) as e:
        process_image(url, "messages[0].content[1]", QWEN25_VL)
    assert e.value.where == "messages[0].content[1]" and str(e.value).startswith("messages[0].content[1]: ")


def chat_with(*urls):
    parts = [{"type": "text", "text": "What is in these?"}]
    parts += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return RenderSpec([{"role": "user", "content": parts}])


def test_the_render_tier_puts_each_images_visual_tokens_in_the_prompt():
    render = render_for(make_config({"target": {"model": "qwen2.5-vl-7b"}}))
    tok = render.tokenizer
    pad, start, end = (
        tok.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>")
    )
    small = data_url(picture(3, (224, 224)))  # 8 x 8 = 64 tokens
    rendered = render.render_spec(chat_with(data_url(picture(1)), small))
    ids, items = rendered.token_ids, rendered.mm_items
    assert [m.num_tokens for m in items] == [256, 64] and ids.count(pad) == 320
    for m in items:
        assert ids[m.offset - 1] == start and ids[m.offset + m.num_tokens] == end
        assert set(ids[m.offset : m.offset + m.num_tokens]) == {pad} and m.pixel_values is not None
    text_only = render.render_spec(RenderSpec([{"role": "user", "content": "What is in these?"}]))
    assert text_only.mm_items == [] and pad not in text_only.token_ids
    assert render.stats.num_images == 2 and render.stats.image_cpu_s > 0


def test_block_hashes_over_an_image_include_its_hash():
    tokens = list(range(16)) + [7] * 32 + list(range(16))  # an image of 32 tokens at 16..48
    one, other = (MultiModalItem(h * 32, 16, 32) for h in ("ab", "cd"))
    a, b = hash_blocks(tokens, 16, mm_items=[one]), hash_blocks(tokens, 16, mm_items=[other])
    assert a[0] == b[0] == hash_blocks(tokens, 16)[0]  # before the image: text only
    assert a[1] != b[1] and a[2] != b[2] and a[3] != b[3]  # the image's blocks, and every later one
    # hashing on from the middle gives the same chain
    assert hash_blocks(tokens[32:], 16, a[1], [one], start=32) == a[2:]
