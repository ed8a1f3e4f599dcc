"""Images computed for real: the engine encodes them with the vision tower inside its steps, splices
the embeddings in place of the placeholders, caches them by hash, and pays the target encoder's time."""

import asyncio

import numpy as np
import pytest

from actors.render.client import render_for
from messages import ClientRequest, RenderSpec
from tests.factories import COLLOCATED, PD, make_config, run_requests
from tests.test_images import data_url, picture

VL = {"target": {"model": "qwen2.5-vl-7b"}, "runner": {"device": "cpu"}}
REAL = {"runner": {"compute": "real"}, "workload": {"output_policy": "greedy"}}


def image_request(rid, seed, arrival_s=0.0, size=(448, 448), text="What is in this picture?", vl=VL):
    spec = RenderSpec([{"role": "user", "content": [
        {"type": "text", "text": text},
        {"type": "image_url", "image_url": {"url": data_url(picture(seed, size))}},
    ]}])  # fmt: skip
    rendered = render_for(make_config(vl)).render_spec(spec)
    return ClientRequest(rid, arrival_s, rendered.token_ids, 8, mm_items=rendered.mm_items)


def outputs(cfg, *requests):
    results, dep = run_requests(cfg, list(requests))
    assert all(r.error is None for r in results), [r.error for r in results]
    return {r.request_id: r.output_token_ids for r in results}, dep


def test_the_image_decides_the_greedy_tokens_and_a_repeat_is_encoded_once():
    cfg = make_config(COLLOCATED, VL, REAL)
    got, dep = outputs(
        cfg,
        image_request("a", 1),
        image_request("b", 2, 1.0),
        image_request("c", 1, 2.0, text="Describe it."),  # the same image after other text
        image_request("a-again", 1, 3.0),  # the same prompt: its KV is cached, image blocks included
    )
    assert got["a"] != got["b"]  # another image, other tokens: the embeddings are used
    assert got["a"] == got["a-again"]
    cache = dep.engines[0].scheduler.encoder_cache
    assert (cache.num_queries, cache.num_hits) == (3, 1)  # c hit the encoder cache; a-again never asked
    from dashboards import metrics as m
    from dashboards.exposition import merged_exposition, sum_series

    expo = [merged_exposition([em.registry for em in dep.engine_metrics])]
    assert (
        sum_series(expo, m.MM_CACHE_QUERIES.exposed) == 3 and sum_series(expo, m.MM_CACHE_HITS.exposed) == 1
    )


def test_an_image_split_across_prompt_chunks_gives_the_same_tokens():
    """With 64 tokens a step, the 256-token image is encoded once (budget floored at the image) and
    spliced in four chunks; P/D (prefill encodes, decode gets the KV) gives the same tokens too."""
    want, _ = outputs(make_config(COLLOCATED, VL, REAL), image_request("a", 1))
    chunked, _ = outputs(
        make_config(COLLOCATED, VL, REAL, scheduler={"max_num_batched_tokens": 64}), image_request("a", 1)
    )
    pd, _ = outputs(make_config(PD, VL, REAL), image_request("a", 1))
    assert chunked == pd == want


def test_a_corrupted_embedding_changes_the_tokens(monkeypatch):
    from actors.engine.runner.executor import Executor

    want, _ = outputs(make_config(COLLOCATED, VL, REAL), image_request("a", 1))
    real_encode = Executor.encode

    async def corrupted(self, inputs, cache):
        await real_encode(self, inputs, cache)
        for req, item in inputs:
            req.mm_embeds[item.mm_hash] = -req.mm_embeds[item.mm_hash]

    monkeypatch.setattr(Executor, "encode", corrupted)
    got, _ = outputs(make_config(COLLOCATED, VL, REAL), image_request("a", 1))
    assert got != want


def test_encoding_takes_the_target_encoders_time_in_the_step():
    """Compute skip: the first request's TTFT grows by the ViT's roofline time of its image (1,024
    patches of Qwen2.5-VL-7B's encoder on an L40S at the fitted efficiency); the same prompt as text
    tokens does not pay it (rendering free here: an image's processing is on the path too)."""
    from emulation.profiles import GPUS
    from emulation.vision import EncoderRoofline
    from emulation.vision_encoders import VISION_ENCODERS

    free = {"s_per_call": 0.0, "s_per_prompt_token": 0.0, "s_per_image": 0.0, "s_per_image_pixel": 0.0}
    cfg = make_config(COLLOCATED, VL, runner={"compute": "skip"}, render=free)
    with_image = image_request("a", 1)
    with_image.forced_output_token_ids = [1] * 8
    text_only = ClientRequest("t", 0.0, with_image.prompt_token_ids, 8, [1] * 8)
    (a,), _ = run_requests(cfg, [with_image])
    (t,), _ = run_requests(cfg, [text_only])
    t_cfg = cfg.target
    vit = EncoderRoofline(
        VISION_ENCODERS["qwen2.5-vl-vit-7b"], GPUS["l40s"], 1, t_cfg.eta_compute, t_cfg.eta_bandwidth
    )
    extra_s = a.token_times_s[0] - t.token_times_s[0]
    assert extra_s == pytest.approx(vit.encode_time([1024]).total_s, rel=1e-6)


def test_images_to_a_text_only_target_fail_with_a_clear_error():
    cfg = make_config(COLLOCATED, REAL)  # qwen2.5-7b: no vision encoder
    results, _ = run_requests(cfg, [image_request("a", 1)])
    assert results[0].finished_reason == "error" and "vision encoder" in results[0].error


def test_embeddings_are_spliced_at_the_image_positions_only():
    from actors.engine.request import Request
    from actors.engine.runner.executor import image_rows
    from messages import EngineRequest, MultiModalItem

    item = MultiModalItem("ab" * 32, 10, 20)
    req = Request(EngineRequest("r", list(range(40)), 1, mm_items=[item]), 0.0)
    req.mm_embeds[item.mm_hash] = np.arange(20)[:, None] * np.ones((1, 4))
    (at, rows), = image_rows(req, 0, 16)  # fmt: skip
    assert at == 10 and rows[:, 0].tolist() == list(range(6))
    (at, rows), = image_rows(req, 16, 24)  # fmt: skip
    assert at == 0 and rows[:, 0].tolist() == list(range(6, 20))
    assert image_rows(req, 30, 10) == []


EPD = {"pools": {**PD["pools"], "encoder": {"replicas": 1}}}


@pytest.mark.parametrize("model", ["qwen2.5-vl-7b", "qwen3-vl-4b"])
def test_e_p_d_gives_the_tokens_of_an_engine_encoding_locally(model):
    """Real compute: the image encoded on the encoder pool, its embeddings moved to prefill, the KV to
    decode: the same greedy tokens as one collocated engine encoding in its own step (each target's
    patches: 14 pixels, 256 visual tokens; 16 pixels, 196)."""
    vl = {**VL, "target": {"model": model}}
    a = image_request("a", 1, vl=vl)
    b = image_request("b", 2, 1.0, vl=vl)
    assert a.mm_items[0].num_tokens == (256 if model.startswith("qwen2.5") else 196)
    want, _ = outputs(make_config(COLLOCATED, vl, REAL), a, b)
    got, dep = outputs(make_config(EPD, vl, REAL), a, b)
    assert got == want
    assert dep.encoders[0].num_encoded == 2 and all(
        e.scheduler.encoder_cache.num_queries == 0 for e in dep.engines
    )


def test_a_repeated_image_is_encoded_once_and_its_wait_is_the_encoder_plus_the_ec_transfer():
    from emulation.profiles import GPUS, LINKS
    from emulation.transfer import handoff_time
    from emulation.vision import EncoderRoofline
    from emulation.vision_encoders import VISION_ENCODERS

    cfg = make_config(EPD, VL, runner={"compute": "skip"})
    reqs = [image_request("a", 1), image_request("c", 1, 5.0, text="Describe it.")]
    for r in reqs:
        r.forced_output_token_ids = [1] * 8
    results, dep = run_requests(cfg, reqs)
    assert [r.error for r in results] == [None, None]
    enc = dep.encoders[0]
    assert enc.num_encoded == 1 and enc.cache.num_hits == 1  # the second time: from the encoder's cache
    t = cfg.target
    vit = EncoderRoofline(
        VISION_ENCODERS["qwen2.5-vl-vit-7b"], GPUS["l40s"], 1, t.eta_compute, t.eta_bandwidth
    )
    ec_s = handoff_time(256 * 7168, 1, LINKS[cfg.ec_transfer.link]).total_s
    first, repeat = results
    assert first.encode_s == pytest.approx(vit.encode_time([1024]).total_s + t.step_overhead_s + ec_s)
    assert repeat.encode_s == pytest.approx(ec_s)  # no encoder time, the embeddings still move
    assert first.ec_transfer_s == repeat.ec_transfer_s == pytest.approx(ec_s)
    from dashboards import metrics as m
    from dashboards.exposition import sum_series

    expos = dep.expositions()
    encoder = [expos["encoder-0"]]
    assert sum_series(encoder, m.MM_CACHE_QUERIES.exposed, role="encoder") == 2
    assert sum_series(encoder, m.MM_CACHE_HITS.exposed, role="encoder") == 1
    assert sum_series(encoder, m.STEPS.exposed, role="encoder") == 1
    assert sum_series([expos["proxy"]], m.ENCODE.count) == 2  # both requests waited for their image
    assert sum_series([expos["proxy"]], m.EC_TRANSFER.sum) == pytest.approx(2 * ec_s)
    from cluster.outcome import encoder_summary

    stats = enc.stats()  # what the summary reads: the values the series show
    assert sum_series(encoder, m.BUSY.exposed, role="encoder") == stats.busy_s > 0
    summary = encoder_summary([stats], 10.0)
    assert summary["encoder_cache_hit_rate"] == 0.5 and 0 < summary["encoder_busy_fraction"] < 0.01


def test_synthetic_images_lead_each_prompt_and_reuse_draws_earlier_ones():
    from workloads.synthetic import synthetic_requests

    images = {"images_per_request": "constant:2", "image_tokens": 400, "image_reuse": 0.5}
    w = make_config(
        VL, workload={**images, "prompt_len": 100, "num_requests": 40, "text_only_fraction": 0.25}
    )
    w = w.workload
    reqs = synthetic_requests(w, 8192, seed=3)
    with_images = [r for r in reqs if r.mm_items]
    assert 0.5 < len(with_images) / len(reqs) < 0.95  # about a quarter text only
    for r in with_images:
        assert len(r.prompt_token_ids) == 100 + 2 * (400 + 2)
        assert [m.offset for m in r.mm_items] == [1, 403] and all(m.pixel_values is None for m in r.mm_items)
        assert all(set(r.prompt_token_ids[m.offset : m.offset + 400]) == {8191} for m in r.mm_items)
    hashes = [m.mm_hash for r in with_images for m in r.mm_items]
    assert len(set(hashes)) < len(hashes)  # some images came again
    assert synthetic_requests(w, 8192, seed=3)[5].mm_items == reqs[5].mm_items  # deterministic
    for patch_size in (14, 16):  # Qwen2.5-VL's patches, Qwen3-VL's
        with_pixels = synthetic_requests(w, 8192, seed=3, patch_size=patch_size)
        first = next(r for r in with_pixels if r.mm_items).mm_items[0]
        assert first.pixel_values.shape == (1600, 6 * patch_size**2) and first.grid_thw == (1, 40, 40)


def test_the_encoder_batches_jobs_within_its_budget_and_serves_repeats_from_its_cache():
    from actors.encoder.encoder import EncoderCore
    from actors.engine.clock import Clock
    from actors.engine.scheduling.encoder_cache import EncoderCache
    from emulation.profiles import GPUS
    from emulation.vision import EncoderRoofline
    from emulation.vision_encoders import VISION_ENCODERS
    from messages import EncodeJob, MultiModalItem
    from tests.factories import run_async

    roofline = EncoderRoofline(VISION_ENCODERS["qwen2.5-vl-vit-7b"], GPUS["a100-80gb"])
    items = [MultiModalItem(h * 32, 0, n) for h, n in (("aa", 400), ("bb", 1300), ("cc", 400))]

    async def main():
        enc = EncoderCore(
            "e0",
            clock=Clock(),
            roofline=roofline,
            vision=None,
            max_num_batched_encoder_embeds=2048,
            cache=EncoderCache(4096),
        )
        enc.start()
        jobs = [EncodeJob(f"r{i}", m, 0.0) for i, m in enumerate([*items, items[0]])]  # a twice at once
        done = await asyncio.gather(*(enc.encode(job) for job in jobs))
        again = await enc.encode(EncodeJob("r3", items[0], 10.0))
        await enc.drain()
        enc.assert_empty()
        return enc, done, again

    enc, done, again = run_async(main())
    first = roofline.visual_tokens_time([400, 1300]).total_s  # a and b fit 2,048; c does not, and waits
    c_s = first + roofline.visual_tokens_time([400]).total_s
    assert [d.done_s for d in done] == pytest.approx([first, first, c_s, first])
    assert enc.num_steps == 2 and enc.num_encoded == 3  # the second a waited for the first
    assert again.cached and again.done_s == 10.0


def test_servegen_image_clients_send_images_to_a_vision_language_target_only():
    """ServeGen's mm-image client 0 (one image of 525-1,230 visual tokens a request): through E+PD the
    images go to the encoder pool; a text-only target gets the same number of prompt tokens as text."""
    from cluster.config_load import load_designs
    from cluster.virtual import run_virtual
    from tests.factories import TRACES

    mm_image = TRACES / "servegen" / "data" / "multimodal" / "mm-image"
    trace = ["workload.kind=trace", f"replay.trace={mm_image}", "replay.clients=[0]",
             "replay.window_s=[36000,36030]", "runner.compute=skip"]  # fmt: skip
    (epd,) = load_designs("epd-a100", ["e-pd"], trace)
    vl = run_virtual(epd).results
    assert len(vl) > 5 and vl["ok"].all() and (vl["encode_s"] > 0).all()
    (text,) = load_designs("epd-a100", ["all-in-one"], [*trace, "target.model=qwen2.5-7b"])
    plain = run_virtual(text).results
    assert (plain["encode_s"] == 0).all()
    # the same requests: each image's tokens as text, without the two vision markers an image adds
    assert (vl["num_prompt_tokens"].to_numpy() - plain["num_prompt_tokens"].to_numpy() == 2).all()
