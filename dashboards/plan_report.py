"""`testbed plan`'s report.html: per target, the explanation and the ranked table; then the Pareto
plots (`plan_plots`) embedded, and what the search cost."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

_STYLE = """body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; }
ul.findings { font-size: 1.05em; line-height: 1.5; background: #f4f7fb; padding: 0.6em 0.6em 0.6em 2em; }
.scroll { overflow-x: auto; } img { max-width: 100%; }
table { border-collapse: collapse; font-size: 0.85em; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.45em; }"""


def write_plan_report(
    out: Path,
    title: str,
    targets: list[tuple[str, list[str], pd.DataFrame]],
    plots: list[Path],
    notes: list[str],
) -> Path:
    """`targets`: (name, explanation lines, ranked table) each; returns the HTML's path."""
    parts = [f"<h1>{html.escape(title)}</h1>"]
    for name, lines, table in targets:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
        parts.append(f'<h2>{html.escape(name)}</h2><ul class="findings">{items}</ul>')
        rows = table.to_html(index=False, na_rep="-", float_format="{:.3g}".format)
        parts.append(f'<div class="scroll">{rows}</div>')
    for path in plots:
        data = base64.b64encode(path.read_bytes()).decode()
        parts.append(
            f'<h2>{html.escape(path.stem)}</h2><img alt="{path.stem}" src="data:image/png;base64,{data}">'
        )
    parts.append("<h2>Search</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    parts.append(
        "<p>Every replay's per-request rows: <code>results.parquet</code>; each candidate's resolved config: "
        "<code>configs/</code>; the recommended design: <code>recommended.yaml</code>.</p>"
    )
    page = f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
    page += f"<style>{_STYLE}</style></head><body>{''.join(parts)}</body></html>"
    path = out / "report.html"
    path.write_text(page)
    return path
