"""The report's figures as drawn: nothing of TTFT's parts legend falls outside its figure (where the saved
PNG would cut its labels off), however many parts and panels it has."""

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from dashboards.report_plots import ttft_stack
from messages.latency import HANDOFF_PARTS


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _results(designs: list[str], rates: list[float], n: int = 4) -> pd.DataFrame:
    """Successful P/D requests with every part of TTFT non-zero: rendering, encoding, an EC transfer,
    queue + prefill and each part of the handoff (the most legend entries a run has)."""
    rows = []
    for design in designs:
        for rate in rates:
            for i in range(n):
                handoff = {f"handoff_{p}_s": 0.001 * (j + 1) for j, p in enumerate(HANDOFF_PARTS)}
                rows.append(
                    {
                        "design": design,
                        "rate": rate,
                        "ok": True,
                        "arrival_s": float(i),
                        "render_s": 0.002,
                        "encode_s": 0.010,
                        "ec_transfer_s": 0.003,
                        "prefill_done_s": i + 0.050,
                        "ttft_s": 0.050 + sum(handoff.values()),
                        **handoff,
                    }
                )
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("designs", "rates"),
    [
        (["collocated", "pd-testbox", "pd-fast"], [0.2]),  # one panel: the narrowest figure
        (["pd-bidirectional-host"], [0.2, 0.4]),
        (["collocated", "pd"], [0.5, 1.0, 2.0, 4.0]),
    ],
)
def test_the_ttft_parts_legend_lies_inside_its_figure(designs, rates):
    fig = ttft_stack(_results(designs, rates))
    assert fig is not None
    fig.canvas.draw()
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert {"render", "encode", "EC transfer", "median TTFT"} <= set(labels)  # every part has an entry
    assert {f"handoff: {p.replace('_', ' ')}" for p in HANDOFF_PARTS} <= set(labels)
    box, page = legend.get_window_extent(), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, (box, page)
    for ax in fig.axes:  # the panels above the legend, not under it
        assert ax.get_window_extent().y0 >= box.y1 - 1, (ax.get_title(), box)
