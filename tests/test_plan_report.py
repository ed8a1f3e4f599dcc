"""`testbed plan` reads like a verdict: the terminal's table fits its width with human headers, goodput
is in one unit in the table and the sentences, report.html renders in a real browser with every
image loaded, its tables within the viewport and its headings and columns in words with units, and
no text of either plot overlaps another."""

from __future__ import annotations

import html
import itertools
import json
import re
import shutil
import subprocess

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

from dashboards.numbers import readable
from dashboards.plan_plots import cost_figure, tokens_figure

from .factories import cli_process
from .test_report import _CHECK, _page_text

RAW_NAMES = ("pareto_tokens", "goodput_cost", "usd_per_hour", "goodput_load", "goodput_rps", "tps_per_")
"""Field and file names that must not be shown as headings or columns."""
TARGETS = ("ttft<=2s,tpot<=50ms", "ttft:p99<=4s")
CONSOLE_WIDTH = 170
"""The terminal's width the plan prints for."""

pytestmark = pytest.mark.parallel  # its `full` tests: a browser on a written page


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """A small plan of the guide's three designs x two chunk sizes under two targets (in a process of its
    own: `factories.cli_process`): its run directory, plan.json and what it printed."""
    out = tmp_path_factory.mktemp("plan")
    argv = ["plan", "--preset", "guide-l40s", "--num-requests", "16", "--seeds", "1", "--jobs", "2"]
    argv += ["--loads", "0.4,0.8,1.2,1.6", "--vary", "scheduler.max_num_batched_tokens=1024,4096"]
    argv += [f"--slo={t}" for t in TARGETS]
    # as a terminal of that width (xdist's workers say 80)
    printed = cli_process(*argv, "--out", str(out), env={"COLUMNS": str(CONSOLE_WIDTH)})
    return out, json.loads((out / "plan.json").read_text()), printed


# -- the terminal ----------------------------------------------------------------------------------


def test_the_terminal_table_fits_and_says_goodput_in_one_unit(plan):
    out, info, printed = plan
    lines = [line for line in printed.splitlines() if str(out) not in line]  # (a path is as long as it is)
    assert max(len(line) for line in lines) <= CONSOLE_WIDTH
    assert "…" not in printed  # no header or cell cut short
    for raw in (*RAW_NAMES, "tok/s/", "GPU(s)", "req/$"):
        assert raw not in printed, raw
    for words in ("goodput", "per GPU", "req/s", "requests per $", "tokens/s", "busiest", "left the"):
        assert words in printed, words
    rows = info["targets"][0]["rows"]
    for row in rows:  # a name wraps between its words, never inside one
        assert all(word in printed for word in row["candidate"].split())
    best = rows[0]
    verdict = next(line for line in lines if "Recommended:" in line)
    load, gpus = best["goodput_load"], best["num_gpus"]
    assert info["goodput_unit"] == "req/s"
    assert f"up to {load:g} req/s on {gpus} GPUs ({readable(load / gpus)} req/s per GPU" in verdict
    first = next(line for line in lines if line.startswith("│ 1 "))  # the table's goodput: the same number
    cells = [c.strip() for c in first.split("│")]
    assert [f"{load:g}", readable(load / gpus)] == cells[4:6], cells
    assert "Target TTFT p90 ≤ 2 s and TPOT p90 ≤ 50 ms (--slo ttft<=2s,tpot<=50ms)" in printed
    assert "Target TTFT p99 ≤ 4 s (--slo ttft:p99<=4s)" in printed


@pytest.mark.parametrize("columns", [100, 80])
def test_on_a_narrow_terminal_the_table_leaves_columns_out_and_cuts_no_value(tmp_path, columns):
    argv = ["plan", "--preset", "guide-l40s", "--num-requests", "16", "--seeds", "1", "--jobs", "2"]
    argv += ["--loads", "0.4,0.8,1.2", "--vary", "scheduler.max_num_batched_tokens=1024,4096"]
    printed = cli_process(*argv, "--out", str(tmp_path), env={"COLUMNS": str(columns)})
    table = printed[: printed.index("Target ")]
    assert "…" not in table and max(len(line.rstrip()) for line in table.splitlines()) <= columns
    assert f"left out at {columns} columns: left the search" in " ".join(table.split())
    for words in ("goodput", "candidate", "GPUs"):
        assert words in table


# -- report.html in a browser ----------------------------------------------------------------------

_PLAN_CHECK = """<script>window.addEventListener("load", () => {
  const text = e => e.innerText.replace(/\\s+/g, " ").trim();
  const result = {
    tables_right: [...document.querySelectorAll("table")].map(t => t.getBoundingClientRect().right),
    headers: [...document.querySelectorAll("th")].map(text),
    headings: [...document.querySelectorAll("h1, h2, caption")].map(text),
  };
  const pre = document.createElement("pre"); pre.id = "plan-check";
  pre.textContent = JSON.stringify(result); document.body.appendChild(pre);
});</script></body>"""


def _browse(browser: str, page, width: int) -> tuple[dict, dict]:
    """The page in headless Chromium `width` pixels wide: the run report's check (its first table,
    the images, the page's width) and this one's (every table, the headers and headings)."""
    checked = page.with_name(f"checked-{width}.html")
    script = _CHECK.replace('"table.summary"', '"table"').replace("</body>", "")
    checked.write_text(page.read_text().replace("</body>", script + _PLAN_CHECK))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", f"--window-size={width},3000"]
    dom = subprocess.run(
        [browser, *flags, "--virtual-time-budget=5000", "--dump-dom", checked.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    found = [re.search(rf'<pre id="{i}">(.*?)</pre>', dom, re.DOTALL) for i in ("check", "plan-check")]
    assert all(found), dom[-2000:]
    return tuple(json.loads(html.unescape(f[1])) for f in found)  # type: ignore[index, return-value]


@pytest.mark.full
@pytest.mark.parametrize("width", [1400, 1024])
def test_the_plan_report_renders_without_a_sideways_scrollbar(plan, width):
    """Headless Chromium: both plots decode, every table fits the window, the page does not scroll
    sideways, and every heading and column header is in words with its unit, no field name."""
    browser = shutil.which("chromium")
    if browser is None:
        pytest.fail("chromium is not installed: apt-get install chromium")
    out, info, _ = plan
    result, mine = _browse(browser, out / "report.html", width)
    assert {alt for alt, _ in result["images"]} == {"pareto_tokens", "goodput_cost"}
    assert all(loaded for _, loaded in result["images"]), result["images"]
    assert result["page_width"] <= result["viewport"]
    assert len(mine["tables_right"]) == len(TARGETS)
    assert all(right <= result["viewport"] for right in mine["tables_right"]), mine["tables_right"]
    shown = mine["headers"] + mine["headings"]
    for raw in (*RAW_NAMES, "_"):
        assert not [s for s in shown if raw in s], (raw, shown)
    for header in ("goodput req/s", "goodput per GPU req/s", "requests per $", "output tokens/s per GPU"):
        assert header in mine["headers"], (header, mine["headers"])
    assert "Target: TTFT p90 ≤ 2 s and TPOT p90 ≤ 50 ms" in mine["headings"]
    assert "Target: TTFT p99 ≤ 4 s" in mine["headings"]
    text = _page_text(out / "report.html")
    best = info["targets"][0]["rows"][0]
    assert f"up to {best['goodput_load']:g} req/s on {best['num_gpus']} GPUs" in text
    assert "Traceback" not in text


# -- the plots ---------------------------------------------------------------------------------------


def _texts(fig: Figure) -> list[tuple[str, Bbox]]:
    """Every text drawn, as laid out (a legend as one box): tick labels within the view, axis
    labels, titles, annotations."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    found = []
    for ax in fig.axes:
        for axis, (lo, hi) in ((ax.xaxis, sorted(ax.get_xlim())), (ax.yaxis, sorted(ax.get_ylim()))):
            for tick in axis.get_major_ticks():
                if lo <= tick.get_loc() <= hi and tick.label1.get_visible() and tick.label1.get_text():
                    found.append((tick.label1.get_text(), tick.label1.get_window_extent(renderer)))
        labels = [ax.xaxis.label, ax.yaxis.label, ax.title, *ax.texts]
        found += [(t.get_text(), t.get_window_extent(renderer)) for t in labels if t.get_text()]
        legend = ax.get_legend()
        if legend is not None:
            found.append(("legend", legend.get_window_extent(renderer)))
    if fig._suptitle is not None:  # type: ignore[attr-defined]
        found.append((fig._suptitle.get_text(), fig._suptitle.get_window_extent(renderer)))  # type: ignore[attr-defined]
    return found


def _overlaps(fig: Figure) -> list[tuple[str, str]]:
    """Pairs of texts that intersect, and texts (as `(text, "the figure's edge")`) not inside it."""
    texts = _texts(fig)
    edge = fig.bbox.padded(0.5)
    found = [(a, "the figure's edge") for a, box in texts if not edge.contains(box.x0, box.y0)]
    found += [(a, "the figure's edge") for a, box in texts if not edge.contains(box.x1, box.y1)]
    for (a, box_a), (b, box_b) in itertools.combinations(texts, 2):
        if box_a.overlaps(box_b):
            found.append((a, b))
    return found


def _candidates(priced: bool) -> pd.DataFrame:
    """30 candidates crowding the cost plot: names of two config keys, every GPU count at loads a hair
    apart, six spots taken twice."""
    rows = []
    for i in range(30):
        gpus = 1 + i % 4
        load = [None, 0.4, 0.8, 1.0, 1.05, 1.1][(i // 4) % 6]
        rows.append(
            {
                "rank": i + 1,
                "name": f"pd-fast p{gpus}d{gpus} pools.prefill.replicas={i} kv_transfer.link=rdma-400g",
                "goodput_load": load,
                "bounded": i % 5 == 0,
                "usd_per_hour": 1.29 * gpus if priced else None,
                "num_gpus": gpus,
                "recommended": i == 0,
            }
        )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("priced", [True, False])
def test_no_label_of_the_cost_plot_overlaps_another_or_a_marker(priced):
    candidates = _candidates(priced)
    fig = cost_figure(candidates, "TTFT p90 ≤ 2 s and TPOT p90 ≤ 50 ms and ITL p99 ≤ 60 ms", "req/s")
    assert _overlaps(fig) == []
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    x = candidates["usd_per_hour"] if priced else candidates["num_gpus"]
    points = ax.transData.transform(np.column_stack([x, candidates["goodput_load"].fillna(0.0)]))
    labels = [t.get_window_extent(renderer) for t in ax.texts]
    spots = {(round(px, 3), round(py, 3)) for px, py in points}
    assert len(labels) == len(spots)  # one label per spot, ranks on one spot joined
    for box in labels:
        assert not any(box.contains(px, py) for px, py in points)
    shown = sorted(int(r) for t in ax.texts for r in re.findall(r"\d+", t.get_text().replace("-", " ")))
    assert set(shown) <= set(candidates["rank"]) and shown[0] == 1  # the runs `4-6`: their ends shown


def test_no_text_of_the_tokens_plot_overlaps_another():
    rng = np.random.default_rng(3)
    names = [
        f"collocated c{n} scheduler.max_num_batched_tokens={2**k}" for n in (1, 2, 4) for k in range(10, 16)
    ]
    points = pd.DataFrame(
        [
            {
                "candidate": name,
                "tps_per_user": rng.uniform(10, 60),
                "tps_per_gpu": rng.uniform(20, 12000),
                "met": m,
            }
            for name in names
            for m in (True, False)
        ]
    )
    fig = tokens_figure(
        points, {n: i + 1 for i, n in enumerate(names)}, "TTFT p90 ≤ 2 s and TPOT p90 ≤ 50 ms"
    )
    assert _overlaps(fig) == []


def test_the_overlap_check_finds_labels_drawn_on_top_of_each_other():
    """The check above can fail: two labels on one point, one past the figure's edge."""
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.scatter([1, 2], [1, 2])
    ax.annotate("collocated", (1, 1))
    ax.annotate("pd-fast", (1, 1))
    ax.annotate("far away", (2, 2), xytext=(400, 0), textcoords="offset points")
    found = _overlaps(fig)
    assert ("collocated", "pd-fast") in found and ("far away", "the figure's edge") in found
