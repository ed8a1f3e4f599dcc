"""The render tier's cost model on a replayed run: a trace holds token IDs, so rendering is modelled,
queued on the render replicas and put on every request's path (virtual time, compute skip)."""

import pytest

from cluster.config_load import ConfigError
from emulation.config import RenderConfig
from tests.factories import COLLOCATED, PD, make_config, make_requests, run_requests
from workloads.render_tier import RenderTier
from workloads.results import results_frame
from workloads.summary import summarize

SKIP = {"runner": {"compute": "skip"}}
SLOW_RENDER = {"render": {"replicas": 1, "s_per_call": 0.01, "s_per_prompt_token": 1e-4}}
"""60 ms for a 500-token prompt: large enough to see against a prefill of tens of ms."""


def test_renders_queue_on_the_replicas_first_come_first_served():
    tier = RenderTier(RenderConfig(replicas=2, s_per_call=0.5, s_per_prompt_token=0.001))
    assert tier.cost_s(500) == pytest.approx(1.0)
    # Three at once on two replicas: the third waits for the first free one.
    assert [tier.render_s(0.0, 500) for _ in range(3)] == pytest.approx([1.0, 1.0, 2.0])
    assert tier.render_s(5.0, 0) == pytest.approx(0.5)  # idle again by then


def test_an_images_cost_follows_its_processed_pixels():
    """Per image a fixed cost and one per processed pixel: Qwen3-VL's visual token is 32 x 32 pixels,
    Qwen2.5-VL's 28 x 28; text costs per text token, the visual tokens not counted twice."""
    from emulation.vision_encoders import VISION_ENCODERS

    cfg = RenderConfig(s_per_call=0.0, s_per_prompt_token=1e-3, s_per_image=0.01, s_per_image_pixel=1e-8)
    qwen3, qwen25 = (RenderTier(cfg, VISION_ENCODERS[n]) for n in ("qwen3-vl-vit-4b", "qwen2.5-vl-vit-7b"))
    assert qwen3.cost_s(100) == pytest.approx(0.1)
    assert qwen3.cost_s(100 + 2 * 400, [400, 400]) == pytest.approx(0.1 + 2 * (0.01 + 400 * 1024e-8))
    assert qwen25.cost_s(500, [400]) == pytest.approx(0.1 + 0.01 + 400 * 784e-8)


def test_generated_images_are_rendered_on_the_replayed_path():
    """A generated request's images cost render time in virtual mode (behind `testbed serve` they are
    timed): four images of 400 tokens on Qwen3-VL-4B add 4 x (s_per_image + 409,600 px x s_per_pixel)."""
    images = {"images_per_request": "constant:4", "image_tokens": 400, "prompt_len": 100, "num_requests": 3}
    cost = {"s_per_call": 0.0, "s_per_prompt_token": 0.0, "s_per_image": 0.002, "s_per_image_pixel": 5e-8}
    cfg = make_config(COLLOCATED, SKIP, target={"model": "qwen3-vl-4b"}, workload=images, render=cost)
    from cluster.virtual import run_virtual

    df = run_virtual(cfg).results
    assert df["render_s"].min() == pytest.approx(4 * (0.002 + 400 * 1024 * 5e-8))


@pytest.mark.parametrize("design", [COLLOCATED, PD], ids=["collocated", "pd"])
def test_replayed_requests_are_rendered_before_an_engine_sees_them_and_ttft_counts_it(design):
    requests = make_requests(3, 500, 4, forced=True, gap_s=2.0)
    free, _ = run_requests(
        make_config(design, SKIP, render={"s_per_call": 0.0, "s_per_prompt_token": 0.0}), requests
    )
    slow, _ = run_requests(make_config(design, SKIP, SLOW_RENDER), requests)
    for f, s in zip(free, slow, strict=True):
        assert f.render_s == 0.0 and s.render_s == pytest.approx(0.06)
        engine_times = s.prefill.prefill_times or s.times  # the first engine to see the request
        assert engine_times.queued_s == pytest.approx(s.arrival_s + 0.06)
        # Idle engines 2 s apart: rendering adds to TTFT exactly.
        assert s.token_times_s[0] - f.token_times_s[0] == pytest.approx(0.06)
    df = results_frame(slow, "d", 1.0, 0)
    assert summarize(df, {})["median_render_ms"] == pytest.approx(60.0)


def test_a_burst_queues_on_one_render_replica():
    requests = make_requests(3, 500, 4, forced=True, gap_s=0.0)
    results, _ = run_requests(make_config(COLLOCATED, SKIP, SLOW_RENDER), requests)
    assert [r.render_s for r in results] == pytest.approx([0.06, 0.12, 0.18])


@pytest.mark.parametrize("key", ["s_per_call", "s_per_prompt_token", "s_per_image", "s_per_image_pixel"])
def test_a_negative_render_cost_is_refused_naming_the_field(key):
    with pytest.raises(ConfigError, match=rf"render\.{key}=-1.0: must be >= 0"):
        make_config(render={key: -1.0})
