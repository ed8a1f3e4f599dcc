"""Exposition: serving an actor's registry at `/metrics`, merging registries of one process into one
scrape, and reading expositions back (to trace metric values to the results table)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app

CREATED = "_created"
"""The suffix of a counter's or histogram's creation time (prometheus_client writes it as a gauge of its
own beside the family, as vLLM's expositions carry it)."""


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # no line per scrape
        pass


def serve_metrics(registry: CollectorRegistry, host: str) -> int:
    """Serve `registry` at http://host:PORT/metrics from a daemon thread; returns the free PORT chosen.

    Always in the classic text format: prometheus_client's OpenMetrics answer (which Prometheus 2.x asks
    for) escapes the ':' of `vllm:` names to '_' unless the scraper allows UTF-8, renaming every series.
    """
    app = make_wsgi_app(registry)

    def text_format(environ: dict, start_response: Any) -> Any:
        return app({**environ, "HTTP_ACCEPT": "text/plain"}, start_response)

    server = make_server(host, 0, text_format, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return int(server.server_port)


def merged_exposition(registries: list[CollectorRegistry]) -> str:
    """One exposition of several actors' registries in one process (families merged by name, as a
    scrape of one port must list each family once)."""
    return _merged([family for registry in registries for family in registry.collect()])


def merged_text_expositions(texts: list[str]) -> str:
    """One exposition of several actors' expositions (fetched from actors in other processes)."""
    from prometheus_client.parser import text_string_to_metric_families

    return _merged([family for text in texts for family in text_string_to_metric_families(text)])


def _merged(families: list[Any]) -> str:
    merged: dict[str, Any] = {}
    for family in families:
        if family.name in merged:
            merged[family.name].samples.extend(family.samples)
        else:
            merged[family.name] = family

    class _Merged:
        def collect(self) -> Any:
            return iter(merged.values())

    out = CollectorRegistry(auto_describe=False)
    out.register(_Merged())  # type: ignore[arg-type]
    return generate_latest(out).decode()


def sum_series(expositions: list[str], name: str, **match: str) -> float:
    """Sum of the samples named `name` (with labels matching `match`) over several expositions: a
    counter's `_total`, a histogram's `_count` or `_sum`, never their `_created` times (named apart)."""
    if name.endswith(CREATED):
        raise ValueError(f"{name}: a series' creation time, not a value to sum")
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for text in expositions:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in match.items()):
                    total += s.value
    return total


def sample_values(exposition: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of `exposition` by name and sorted labels, but the `_created` ones: they hold the
    wall-clock time a series was created, so two runs that count alike differ only in them."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
        if not s.name.endswith(CREATED)
    }


def write_sd_file(path: str, design: str, targets: dict[str, str]) -> None:
    """Prometheus file-based service discovery: one target per actor (Prometheus re-reads the file).
    Besides ours, each target has the labels Kubernetes scraping adds (`namespace`: the design, `pod`:
    the actor, e.g. `decode-0`), so boards written for llm-d (`pod=~".*decode.*"`) work unchanged."""
    groups = [
        {"targets": [t], "labels": {"design": design, "actor": a, "namespace": design, "pod": a}}
        for a, t in targets.items()
    ]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups, indent=1) + "\n")
    tmp.replace(out)  # atomic: Prometheus never reads half a file


class Expositions(Mapping[str, str]):
    """Actors' final expositions by actor id, each rendered when first read (a sweep reads none)."""

    def __init__(self, render: dict[str, Callable[[], str]]) -> None:
        self._render = render
        self._text: dict[str, str] = {}

    def __getitem__(self, actor: str) -> str:
        if actor not in self._text:
            self._text[actor] = self._render[actor]()
        return self._text[actor]

    def __iter__(self) -> Iterator[str]:
        return iter(self._render)

    def __len__(self) -> int:
        return len(self._render)
