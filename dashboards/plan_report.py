"""`testbed plan`'s report.html: per target, the verdict in sentences and the ranked table (headers in
words with units; it wraps to the page, never scrolls sideways); then the plots (`plan_plots`)
embedded, and what the search cost."""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PlanTable:
    """A ranked table as text: the terminal and the report show the same one."""

    title: str
    headers: tuple[str, ...]
    """Each a few lines (newlines): words, then the unit."""
    rows: tuple[tuple[str, ...], ...]
    text_columns: frozenset[str]
    """Headers of columns of words (left-aligned); the others are numbers."""
    wrapped: frozenset[str]
    """Headers of columns whose cells may wrap at spaces; the others' cells never wrap."""


@dataclass(frozen=True)
class TargetSection:
    heading: str
    """The target in words: `TTFT p90 ≤ 2 s and TPOT p90 ≤ 50 ms`."""
    written: str
    """As the command line wrote it: `ttft:p90<=2s,tpot:p90<=50ms`."""
    findings: tuple[str, ...]
    table: PlanTable


_STYLE = """body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em;
  color: #222; }
ul.findings { font-size: 1.05em; line-height: 1.5; background: #f4f7fb; padding: 0.6em 0.6em 0.6em 2em; }
p.written { color: #555; margin-top: -0.5em; }
img { max-width: 100%; }
table { border-collapse: collapse; font-size: 0.8em; margin-bottom: 1em; }
caption { text-align: left; font-weight: 600; padding-bottom: 0.3em; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.35em; text-align: right; }
th { background: #f2f2f2; vertical-align: bottom; font-weight: 600; white-space: nowrap; }
td { font-variant-numeric: tabular-nums; }
td.text, th.text { text-align: left; }
td.nowrap { white-space: nowrap; }
tr.recommended td { font-weight: 600; }"""


def _breakable(text: str) -> str:
    """`text` escaped, with a line-break opportunity after each `_`, `=`, `/` and a `.` before a letter:
    a config key (`pools.prefill.replicas=2`) wraps between its parts, a number never."""
    return re.sub(r"([_=/]|\.(?=[A-Za-z]))", r"\1<wbr>", html.escape(text))


def _table_html(table: PlanTable) -> str:
    """Cells escaped; the first row (the recommendation) in bold."""
    css = []
    for h in table.headers:
        classes = ["text"] if h in table.text_columns else []
        css.append(f' class="{" ".join([*classes, "wrap" if h in table.wrapped else "nowrap"])}"')
    lines = [html.escape(h).replace("\n", "<br>") for h in table.headers]
    head = "".join(f"<th{c}>{h}</th>" for h, c in zip(lines, css, strict=True))
    body = []
    for i, row in enumerate(table.rows):
        cells = "".join(
            f"<td{c}>{_breakable(v) if h in table.wrapped else html.escape(v)}</td>"
            for h, v, c in zip(table.headers, row, css, strict=True)
        )
        body.append(f'<tr class="recommended">{cells}</tr>' if i == 0 else f"<tr>{cells}</tr>")
    caption = f"<caption>{html.escape(table.title)}</caption>"
    return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def write_plan_report(
    out: Path, title: str, targets: list[TargetSection], plots: list[tuple[str, Path]], notes: list[str]
) -> Path:
    """`plots`: (caption, PNG) each; returns the HTML's path."""
    parts = [f"<h1>{html.escape(title)}</h1>"]
    for t in targets:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in t.findings)
        parts.append(f"<h2>Target: {html.escape(t.heading)}</h2>")
        parts.append(f'<p class="written">as written: <code>--slo {html.escape(t.written)}</code></p>')
        parts.append(f'<ul class="findings">{items}</ul>{_table_html(t.table)}')
    for caption, path in plots:
        data = base64.b64encode(path.read_bytes()).decode()
        parts.append(
            f'<h2>{html.escape(caption)}</h2><img alt="{path.stem}" src="data:image/png;base64,{data}">'
        )
    parts.append("<h2>The search</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    parts.append(
        "<p>Every replay's per-request rows: <code>results.parquet</code>; each candidate's resolved config: "
        "<code>configs/</code>; the recommended design: <code>recommended.yaml</code>; every row in full: "
        "<code>plan.json</code>, <code>candidates.csv</code>.</p>"
    )
    page = f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
    page += f"<style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>"
    path = out / "report.html"
    path.write_text(page)
    return path
