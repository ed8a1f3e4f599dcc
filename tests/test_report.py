"""The run report: it is written for every outcome (no request, none succeeded, some failed) and says
so by reason; its headline is computed from the results; every plot shows every design it applies to;
and the page renders in a real browser with every image loaded and its table within the viewport."""

import html
import json
import re
import shutil
import subprocess

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from cluster.cli import main
from dashboards.headline import failure_reason, handoff_finding, headline, tokens_finding
from dashboards.numbers import percent
from dashboards.plot_style import visible_designs
from dashboards.report import report_figures, write_report
from messages.latency import HANDOFF_PARTS, LATENCY_COLUMNS
from workloads.results import results_frame
from workloads.summary import summarize, sweep_goodput

SLOS = ("ttft<=2s,tpot<=30ms", "ttft<=2s,gap<=100ms")
CONTEXT_LIMIT = (
    'HTTP 400: {{"object":"error","message":"This model\'s maximum context length is 32768 tokens. '
    'However, you requested {} tokens (…). Please reduce the length of the messages.",'
    '"type":"BadRequestError","param":null,"code":400}}'
)
LIMIT_REASON = "HTTP 400: This model's maximum context length is 32768 tokens"
DESIGNS = ["collocated", "pd-testbox", "pd-fast"]
PD_DESIGNS = ["pd-testbox", "pd-fast"]

pytestmark = pytest.mark.parallel  # its `full` test: a browser on a written page


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A small sweep of the guide's three designs at two rates: its results table and records."""
    out = tmp_path_factory.mktemp("sweep")
    args = ["sweep", "--preset", "guide-l40s", "--compute", "skip", "--rates", "1,4", "--seeds", "1"]
    assert main([*args, "--jobs", "1", "--num-requests", "12", "--out", str(out)]) == 0
    return pd.read_parquet(out / "results.parquet"), json.loads((out / "summary.json").read_text())


def _fail(df: pd.DataFrame, rows: pd.Series, reason: str, error: str | None) -> pd.DataFrame:
    """`rows` failed as a client sees it: no token, no latency, no handoff."""
    df = df.copy()
    idx = df.index[rows]
    df.loc[idx, "finished_reason"] = reason
    df.loc[idx, "error"] = [error.format(8192 + i) if error else None for i in range(len(idx))]
    for i in idx:
        df.at[i, "token_times_s"] = np.empty(0)
        df.at[i, "output_token_ids"] = np.empty(0, dtype=np.int64)
    nan_columns = [*LATENCY_COLUMNS, "handoff_s", *(f"handoff_{p}_s" for p in HANDOFF_PARTS)]
    df.loc[idx, nan_columns] = np.nan
    df.loc[idx, "num_output_tokens"] = 0
    df["ok"] = df["finished_reason"].isin(["length", "stop"])
    return df


def _records(df: pd.DataFrame) -> list[dict]:
    """The summary path as the CLI takes it: a record per design and rate."""
    return [
        {"design": d, "rate": r, **summarize(part, SLOS)}
        for (d, r), part in df.groupby(["design", "rate"], sort=False)
    ]


def _page_text(path) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", path.read_text())).split())


def _outcomes(df: pd.DataFrame) -> dict[str, tuple[pd.DataFrame, list[str]]]:
    """Frames of each outcome, with what the report must say of each."""
    collocated = df["design"] == "collocated"
    partly = _fail(df, (df["design"] == "pd-fast") & (df["rate"] == 4), "error", CONTEXT_LIMIT)
    partly = _fail(partly, collocated & (df["rate"] == 4) & (df.index % 2 == 0), "rejected", "queue full")
    n_fast = int(((df["design"] == "pd-fast") & (df["rate"] == 4)).sum())
    n_rejected = int((collocated & (df["rate"] == 4) & (df.index % 2 == 0)).sum())
    n = int(collocated.sum())
    return {
        "empty": (results_frame([], "collocated", 1.0, 0), ["No results"]),
        "all failed": (
            _fail(df, df["design"].notna(), "error", CONTEXT_LIMIT),
            [f"{d}: 0 of {n} succeeded: {n} × {LIMIT_REASON}" for d in DESIGNS],
        ),
        "partly failed": (
            partly,
            [
                f"pd-fast: {n - n_fast} of {n} succeeded: {n_fast} × {LIMIT_REASON}",
                f"collocated: {n - n_rejected} of {n} succeeded: {n_rejected} × rejected: queue full",
                "pd-testbox: every request succeeded",
            ],
        ),
    }


@pytest.mark.parametrize("outcome", ["empty", "all failed", "partly failed"])
def test_the_report_is_written_for_every_outcome_and_counts_failures_by_reason(sweep, tmp_path, outcome):
    df, expected = _outcomes(sweep[0])[outcome]
    whole = summarize(df, SLOS)  # every summary path takes it
    assert whole["completed"] == df["ok"].sum() and whole["failed"] + whole["rejected"] == (~df["ok"]).sum()
    records = _records(df) if len(df) else [{"design": "collocated", "rate": 1.0, **whole}]
    sweep_goodput(records)
    page = write_report(tmp_path, df, records, "outcome", ["a note"])
    text = _page_text(page)
    for needle in expected:
        assert needle in text
    assert "Traceback" not in text
    if outcome == "partly failed":  # the table lists each reason with a full error text
        assert "Failed requests by reason" in text and "you requested 8192 tokens" in text
    if outcome != "partly failed":  # nothing succeeded: the plots that need a success are left out
        assert {p.stem for p in (tmp_path / "plots").glob("*.png")} <= {"goodput"}


def test_failure_reasons_are_short_enough_to_count_by():
    assert failure_reason("error", CONTEXT_LIMIT.format(40000)) == LIMIT_REASON
    cut = CONTEXT_LIMIT.format(40000)[:60]  # the client keeps 300 characters of a body
    assert failure_reason("error", cut).startswith("HTTP 400: This model")
    assert failure_reason("error", "ConnectError: [Errno 111] Connection refused") == (
        "ConnectError: [Errno 111] Connection refused"
    )
    assert failure_reason("abort", None) == "abort"
    assert failure_reason("rejected", "waiting queue full (max_waiting=4). Try later") == (
        "rejected: waiting queue full (max_waiting=4)"
    )


def test_the_headline_is_computed_from_the_results(sweep):
    df, records = sweep
    lines = [f.text for f in headline(df, records)]
    goodput = sweep_goodput(records)
    for slo in SLOS:
        line = next(x for x in lines if x.startswith(f"SLO {slo}"))
        for design, per in goodput.items():
            rate = per[slo]
            assert re.search(
                f"{design} (holds it )?" + (f"up to {rate:g} req/s" if rate else "at none"), line
            )

    # Every design holds the first SLO at every rate (every value within each bound): the headline says so.
    within = {
        t: {**c, "num_within": c["num_values"], "num_failed": 0}
        for t, c in records[0]["slo_term_counts"][SLOS[0]].items()
    }
    held = [r | {"slo_term_counts": {**r["slo_term_counts"], SLOS[0]: within}} for r in records]
    line = next(f.text for f in headline(df, held) if f.text.startswith(f"SLO {SLOS[0]}"))
    assert all(re.search(f"{d} (holds it )?up to 4 req/s", line) for d in DESIGNS)

    # The handoff's share: a slower handoff takes more of TTFT.
    before = handoff_finding(df)
    slower = df.copy()
    pd_rows = slower["handoff_s"].notna()
    slower.loc[pd_rows, "handoff_wire_s"] += 5.0
    slower.loc[pd_rows, "ttft_s"] += 5.0
    after = handoff_finding(slower)
    assert before is not None and after is not None and before.text != after.text
    for design in PD_DESIGNS:  # at the lowest rate
        rows = slower[pd_rows & (slower["design"] == design) & (slower["rate"] == 1)]
        path_s = rows[[f"handoff_{p}_s" for p in HANDOFF_PARTS]].sum(axis=1)
        assert f"{design} {percent((path_s / rows['ttft_s']).median())} (" in after.text

    # Lag: a live run whose host fell behind is called invalid, by design.
    lagged = [
        r | {"lag_fraction": 0.05, "max_overrun_ms": 12.0} if r["design"] == "pd-fast" else r for r in records
    ]
    warnings = [f.text for f in headline(df, lagged) if f.warn]
    assert warnings == ["LAG: pd-fast's steps and handoffs overran their emulated budget 5.0 % of the time "
                        "(worst by 12 ms): its latencies are not valid."]  # fmt: skip
    assert not any(f.warn for f in headline(df, records))

    # Greedy tokens against a reference: each design's equal requests, counted.
    assert tokens_finding(df, records) is None
    checked = df.assign(diverged_at=np.nan)
    first_fast = checked.index[checked["design"] == "pd-fast"][0]
    checked.loc[first_fast, "diverged_at"] = 3.0
    found = tokens_finding(checked, [r | {"reference": "collocated"} for r in records])
    n = int((df["design"] == "pd-fast").sum())
    assert found is not None and found.warn
    assert f"pd-fast's greedy tokens equal collocated's for {n - 1} of {n} requests" in found.text
    assert f"pd-testbox's greedy tokens equal collocated's for {n} of {n} requests" in found.text


def _sessions(df: pd.DataFrame) -> pd.DataFrame:
    """The sweep's requests as turns of sessions, for the session plots."""
    turn = df.groupby(["design", "rate"]).cumcount() % 4
    return df.assign(turn=turn.astype(float), session_id="s")


def _drawn(df: pd.DataFrame, records: list[dict]) -> dict[str, list[set[str]]]:
    """Per plot, per visible axes: the designs with visible data in it."""
    drawn = {}
    for name, _, fig in report_figures(df, records):
        if fig is not None:
            fig.canvas.draw()  # the final layout, as saved
            drawn[name] = [visible_designs(ax) for ax in fig.axes if ax.get_visible()]
    return drawn


def test_every_plot_shows_every_design_it_applies_to(sweep):
    df, records = sweep
    drawn = _drawn(_sessions(df), records)
    assert set(drawn) == {
        "ttft_cdf", "itl_cdf", "stalls", "handoff", "ttft_parts", "goodput", "ttft_by_turn", "ttft_by_context"
    }  # fmt: skip
    for name in ("ttft_cdf", "itl_cdf", "ttft_parts", "goodput", "ttft_by_turn", "ttft_by_context"):
        for panel in drawn[name]:
            assert panel == set(DESIGNS), name
    assert drawn["stalls"] == [{d} for d in DESIGNS]  # a panel per design, its own
    assert drawn["handoff"] == [{d} for d in PD_DESIGNS]  # both P/D designs, each visible


def test_a_design_without_a_success_at_a_rate_is_named_in_that_panel(sweep):
    df, _ = _outcomes(sweep[0])["partly failed"]
    records = _records(df)
    figures = {name: fig for name, _, fig in report_figures(df, records) if fig is not None}
    for name in ("ttft_cdf", "ttft_parts"):
        figures[name].canvas.draw()
        at_4 = next(ax for ax in figures[name].axes if ax.get_title() == "4 req/s")
        assert visible_designs(at_4) == {"collocated", "pd-testbox"}
        assert at_4.get_title(loc="right") == "no successful request: pd-fast"


def test_designs_are_told_apart_and_axes_cover_their_data(sweep):
    df, records = sweep
    figures = {name: fig for name, _, fig in report_figures(df, records) if fig is not None}
    for name in ("ttft_cdf", "itl_cdf", "goodput"):
        for ax in figures[name].axes:
            styles = [
                (ln.get_color(), ln.get_linestyle(), ln.get_marker()) for ln in ax.lines if ln.get_gid()
            ]
            assert len(styles) == len(set(styles)) >= 2, name
    parts = figures["ttft_parts"].legends[0]
    colors = [tuple(h.get_facecolor()) for h in parts.legend_handles if hasattr(h, "get_facecolor")]
    labels = [t.get_text() for t in parts.get_texts()]
    assert len(colors) == len(set(colors)) and not {"encode", "EC transfer"} & set(labels)  # text only
    for ax in figures["itl_cdf"].axes:
        gaps_ms = 1000 * np.concatenate(
            [np.diff(t) for t in df.loc[df["rate"] == float(ax.get_title().split()[0]), "token_times_s"]]
        )
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert min(ticks) <= gaps_ms.min() and max(ticks) >= gaps_ms.max() and len(ticks) >= 4


_CHECK = """<script>window.addEventListener("load", () => {
  const table = document.querySelector("table.summary").getBoundingClientRect();
  const result = {
    images: [...document.images].map(i => [i.alt, i.complete && i.naturalWidth > 0 && i.width > 0]),
    table_right: table.right, viewport: window.innerWidth,
    page_width: document.documentElement.scrollWidth,
  };
  const pre = document.createElement("pre"); pre.id = "check";
  pre.textContent = JSON.stringify(result); document.body.appendChild(pre);
});</script></body>"""


@pytest.mark.full
def test_the_page_renders_in_a_browser(sweep, tmp_path):
    """Headless Chromium: every image decodes, the summary table fits a 1,400-px window, the page does
    not scroll sideways, and the screenshot is not blank."""
    browser = shutil.which("chromium")
    if browser is None:
        pytest.fail("chromium is not installed: apt-get install chromium")
    df, records = sweep
    page = write_report(tmp_path, df, records, "browser", ["a note"])
    checked = tmp_path / "checked.html"
    checked.write_text(page.read_text().replace("</body>", _CHECK))
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,3000"]
    dom = subprocess.run(
        [browser, *flags, "--virtual-time-budget=5000", "--dump-dom", checked.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    found = re.search(r'<pre id="check">(.*?)</pre>', dom, re.DOTALL)
    assert found is not None, dom[-2000:]
    result = json.loads(html.unescape(found[1]))
    names = {"ttft_cdf", "itl_cdf", "stalls", "handoff", "ttft_parts", "goodput"}
    assert {alt for alt, _ in result["images"]} == names
    assert all(loaded for _, loaded in result["images"]), result["images"]
    assert result["table_right"] <= result["viewport"] and result["page_width"] <= result["viewport"]
    shot = tmp_path / "shot.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    from PIL import Image

    gray = np.asarray(Image.open(shot).convert("L"))
    assert gray.std() > 10  # text, tables and plots: not a blank page
