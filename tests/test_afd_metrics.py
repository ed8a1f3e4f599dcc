"""Attention-FFN disaggregation's steps as series, step logs and the report: every computed token's
hidden states cross the cut at every MoE layer, each way; the pipeline's bubbles and exposed transfers a
step each; the same with macro steps on and off."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.outcome import RunOutput, clean_json, write_json
from cluster.virtual import run_virtual
from dashboards import metrics as m
from dashboards.exposition import sample_values, sum_series
from dashboards.report import write_report
from emulation.profiles import MODELS
from tests.factories import COLLOCATED, make_config

MOE = "qwen3-30b-a3b"
AFD = {"num_attention_ranks": 4, "num_ffn_ranks": 2, "ffn_ep": 2, "link": "rdma-400g", "a2f_dtype": "fp8"}


def afd_config(macro_steps: bool) -> Any:
    """Collocated AFD on H100s (4 attention ranks, 2 FFN ranks of 2 GPUs), prompts in chunks of 1,024
    beside decodes, compute skip."""
    return make_config(
        COLLOCATED,
        target={"model": MOE, "time_model": "operators"},
        pools={"mixed": {"replicas": 1, "gpu": "h100-sxm", "afd": AFD}},
        runner={"compute": "skip", "macro_steps": macro_steps},
        scheduler={"max_num_batched_tokens": 1024},
        workload={"num_requests": 60, "rate": 50.0, "prompt_len": 1500, "output_len": 100},
    )


@pytest.fixture(scope="module")
def afd_run() -> RunOutput:
    return run_virtual(afd_config(macro_steps=False))


def test_every_computed_token_crosses_the_cut_at_every_moe_layer_each_way(afd_run):
    """A2F in FP8 (1 B a hidden value), F2A in BF16 (2 B): the counters are the engine's computed tokens
    x 48 MoE layers x 2,048 hidden x those bytes, and the step log's sums."""
    text = afd_run.metrics["mixed-0"]
    log = afd_run.engine_reports["mixed-0"].moe_steps  # type: ignore[union-attr]
    assert log is not None
    model = MODELS[MOE]
    tokens = sum_series([text], m.ITERATION_TOKENS.sum)
    assert tokens == 60 * 1500 + 60 * 99  # every prompt, and every output token but the last
    for direction, nbytes in (("a2f", 1), ("f2a", 2)):
        moved = sum_series([text], m.AFD_TRANSFER_BYTES.exposed, direction=direction)
        assert moved == tokens * model.num_moe_layers * model.hidden_size * nbytes
    assert sum(log.a2f_bytes) == pytest.approx(tokens * 48 * 2048)
    assert sum(log.num_tokens) == tokens  # the step's tokens (tokens per expert: a micro-batch's)
    num_steps = sum_series([text], m.STEPS.exposed)
    for spec, labels in ((m.AFD_EXPOSED, {}), (m.AFD_BUBBLE, {"side": "attention"}),
                         (m.AFD_BUBBLE, {"side": "ffn"}), (m.AFD_FFN_UTILIZATION, {})):  # fmt: skip
        assert sum_series([text], spec.count, **labels) == num_steps, spec.name
    assert min(log.ffn_utilization) > 0 and max(log.ffn_utilization) <= 1
    assert not any(log.all_to_all_s)  # the FFN ranks' own all-to-alls are inside their step


def test_an_afd_engine_exports_its_labelled_series_at_zero_before_any_step():
    """As vLLM's labelled families are: a rate over a window where the series appeared is then 0, not
    missing (its first scrape is not its final value)."""
    from dashboards.recorders import EngineMetrics

    values = sample_values(EngineMetrics(afd_config(macro_steps=False), "mixed", 0).exposition())
    for name, label in (
        ("testbed:afd_transfer_bytes_total", ("direction", "a2f")),
        ("testbed:afd_transfer_bytes_total", ("direction", "f2a")),
        ("testbed:afd_bubble_seconds_count", ("side", "attention")),
        ("testbed:afd_bubble_seconds_count", ("side", "ffn")),
    ):
        assert [v for (n, labels), v in values.items() if n == name and label in labels] == [0.0], name


def test_macro_steps_record_the_same_afd_steps(afd_run):
    many = run_virtual(afd_config(macro_steps=True))
    assert afd_run.engine_reports == many.engine_reports
    for actor in afd_run.metrics:
        assert sample_values(afd_run.metrics[actor]) == sample_values(many.metrics[actor]), actor


def test_the_report_tabulates_the_afd_pipeline(afd_run, tmp_path):
    design = str(afd_run.summary["design"])
    write_json(tmp_path / "engines.json", {design: dict(afd_run.engine_reports)})
    page = write_report(tmp_path, afd_run.results, [clean_json(afd_run.summary)], "afd", []).read_text()
    assert "Attention-FFN disaggregation per engine" in page and "FFN utilisation" in page
    assert f"<td>{design}</td><td>mixed-0</td>" in page
    assert (tmp_path / "plots" / "moe_steps.png").stat().st_size > 10_000
