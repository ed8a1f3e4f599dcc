"""Hybrid targets' state handoffs and align-mode prefix hits, made visible: NIXL's bytes count the SSM
state beside the KV, `testbed:kv_transfer_state_bytes` counts the state alone, the handoff board plots
both per handoff, and the report draws them (and the hits, on block multiples) against prompt tokens,
for a hybrid run only."""

from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt
import pytest

from cluster.outcome import RunOutput, clean_json
from cluster.virtual import run_virtual
from dashboards import grafana
from dashboards import metrics as m
from dashboards.exposition import sum_series
from dashboards.hybrid_plots import crossover_tokens, hybrid_handoff_figure
from dashboards.plot_style import visible_designs
from dashboards.report import write_report
from emulation.profiles import MODELS
from tests.factories import COLLOCATED, PD, make_config, make_requests
from workloads.summary import handoffs

GRANITE = MODELS["granite-4.0-h-tiny"]  # 36 states of 806,400 B a request; 4 attention layers
BLOCK = 400
"""Its raised block size at TP 1 (tests/test_hybrid_pd.py): align mode's hits are multiples of it."""
HYBRID = {"target": {"model": GRANITE.name}}
SKIP = {"runner": {"compute": "skip"}}
FIRST = make_requests(5, [30, 401, 650, 900, 1300], 8, seed=5, forced=True, gap_s=0.3)
PROMPTS = FIRST + [
    dataclasses.replace(r, request_id=r.request_id + "-again", arrival_s=10.0 + r.arrival_s)
    for r in FIRST[2:]
]
"""Five prompts, then the last three again once they finished: those hit their checkpoints' blocks."""


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def hybrid_run() -> RunOutput:
    return run_virtual(make_config(PD, HYBRID, SKIP, design="pd-hybrid"), PROMPTS)


@pytest.fixture(scope="module")
def dense_run() -> RunOutput:
    return run_virtual(
        make_config(PD, SKIP, design="pd-dense"), make_requests(3, 600, 8, seed=2, forced=True)
    )


def test_each_handoff_counts_its_state_and_nixl_counts_both(hybrid_run):
    df, expos = hybrid_run.results, list(hybrid_run.metrics.values())
    assert df["ok"].all() and (df["state_bytes"] == 36 * 806_400).all()
    state = m.KV_TRANSFER_STATE_BYTES
    assert sum_series(expos, state.count) == sum_series(expos, m.NIXL_XFER_TIME.count) == len(df)
    assert sum_series(expos, state.count, role="decode") == len(df)  # the side that pulls records it
    assert sum_series(expos, state.sum) == df["state_bytes"].sum()
    assert sum_series(expos, m.NIXL_BYTES.sum) == (df["kv_bytes"] + df["state_bytes"]).sum()
    assert sum_series(expos, m.NIXL_BYTES.count) == len(df)


def test_a_dense_target_moves_no_state(dense_run):
    df, expos = dense_run.results, list(dense_run.metrics.values())
    assert (df["state_bytes"] == 0).all()
    assert sum_series(expos, m.KV_TRANSFER_STATE_BYTES.count) == 0  # exported, never observed
    assert sum_series(expos, m.NIXL_BYTES.sum) == df["kv_bytes"].sum() > 0


def test_the_handoff_board_plots_state_and_kv_per_handoff():
    exprs = grafana.expressions(grafana.render("handoff"))
    per_handoff = [e for e in exprs if m.KV_TRANSFER_STATE_BYTES.sum in e]
    assert len(per_handoff) == 2  # the state; the KV: NIXL's bytes less the state
    assert all(m.NIXL_BYTES.count in e.rsplit(" / ", 1)[1] for e in per_handoff)  # each over the handoffs
    assert sum(m.NIXL_BYTES.sum in e for e in per_handoff) == 1


def test_the_figure_shows_the_crossover_and_hits_on_block_multiples(hybrid_run):
    df = hybrid_run.results
    # The KV per prompt token: 4 attention layers x 2,048 B; the state equals it at 3,544 tokens.
    assert crossover_tokens(handoffs(df)) == pytest.approx(36 * 806_400 / (4 * 2048))
    hits = df.set_index("request_id")["prompt_cached_tokens"]
    assert hits[["r2-again", "r3-again", "r4-again"]].tolist() == [400, 800, 1200]
    assert (hits % BLOCK == 0).all() and hits.drop(["r2-again", "r3-again", "r4-again"]).eq(0).all()
    fig = hybrid_handoff_figure(df)
    assert fig is not None
    fig.canvas.draw()
    bytes_ax, hits_ax = fig.axes
    assert visible_designs(bytes_ax) == visible_designs(hits_ax) == {"pd-hybrid"}
    labels = [t.get_text() for t in bytes_ax.get_legend().get_texts()]
    assert labels[:2] == ["KV", "SSM state"] and "state = KV at 3,544 prompt tokens" in labels
    assert bytes_ax.get_xlim()[1] >= 3544  # the crossover within view
    assert f"multiples of {BLOCK} tokens" in hits_ax.get_title()


def test_the_report_of_a_hybrid_run_has_the_figure_and_table(hybrid_run, tmp_path):
    page = write_report(
        tmp_path, hybrid_run.results, [clean_json(hybrid_run.summary)], "hybrid", []
    ).read_text()
    assert (tmp_path / "plots" / "hybrid_handoff.png").stat().st_size > 10_000
    assert 'alt="hybrid_handoff"' in page
    df = hybrid_run.results
    kv_mb, state_mb = df["kv_bytes"].mean() / 1e6, df["state_bytes"].mean() / 1e6
    hit_rate = round(100 * df["prompt_cached_tokens"].sum() / df["num_prompt_tokens"].sum())
    assert f"<td>pd-hybrid</td><td>8</td><td>{kv_mb:.2f}</td><td>{state_mb:.1f}</td>" in page
    assert f"<td>{hit_rate} %</td>" in page


def test_the_report_of_a_dense_run_has_neither(dense_run, tmp_path):
    page = write_report(tmp_path, dense_run.results, [clean_json(dense_run.summary)], "dense", []).read_text()
    assert not (tmp_path / "plots" / "hybrid_handoff.png").exists()
    assert "hybrid_handoff" not in page and "Hybrid target" not in page


def test_a_collocated_hybrid_run_shows_its_hits_when_told_the_target_is_hybrid():
    """No handoff moves a state: the figure needs the target's word (the bytes panel says why empty)."""
    out = run_virtual(make_config(COLLOCATED, HYBRID, SKIP), PROMPTS)
    assert hybrid_handoff_figure(out.results) is None
    fig = hybrid_handoff_figure(out.results, hybrid=True)
    assert fig is not None
    bytes_ax, hits_ax = fig.axes
    assert not bytes_ax.axison and bytes_ax.texts[0].get_text() == "no P/D handoff"
    assert visible_designs(hits_ax) == {str(out.summary["design"])}
