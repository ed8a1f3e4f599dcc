"""HTTP instrumentation as vLLM's API server has it: prometheus-fastapi-instrumentator, configured as
vLLM configures it (its default metrics, the same excluded handlers).

The families it exports (`http_requests_total{handler,method,status}` with statuses grouped as "2xx",
`http_request_size_bytes` and `http_response_size_bytes{handler}` summaries,
`http_request_duration_seconds{handler,method}` with buckets 0.1, 0.5, 1 and
`http_request_duration_highr_seconds` with its many buckets) go in the app's own registry, one per app
(several apps live in one test process), and are appended to the server's `/metrics`.
"""

from __future__ import annotations

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_fastapi_instrumentator import Instrumentator

EXCLUDED_HANDLERS = ["/metrics", "/health", "/load", "/ping", "/version", "/server_info"]
"""Paths vLLM's API server leaves out of its HTTP metrics."""


class HttpMetrics:
    def __init__(self, app: FastAPI) -> None:
        """Instrument `app` (its middleware sits inside any added after it, as vLLM's sits inside its
        API key check: a 401 is not counted)."""
        self.registry = CollectorRegistry()
        Instrumentator(excluded_handlers=EXCLUDED_HANDLERS, registry=self.registry).add().instrument(app)

    def exposition(self) -> str:
        """The HTTP families in Prometheus's text format."""
        return generate_latest(self.registry).decode()
