"""The sessions board's panels: replayed sessions, per-turn TTFT, prefix reuse and the routers."""

from __future__ import annotations

from grafana_foundation_sdk.builders import timeseries

from dashboards import metrics as m
from dashboards.grafana_panels import panel, quantile, rate, sel


def sessions_panels() -> list[timeseries.Panel]:  # a table of panels, not logic
    hits, queries = rate(m.PREFIX_CACHE_HITS, "role"), rate(m.PREFIX_CACHE_QUERIES, "role")
    return [
        panel(
            "Sessions active",
            "short",
            "Replayed sessions with a request in flight at the proxy.",
            (f"max({m.SESSIONS_ACTIVE.name}{sel()})", "sessions"),
        ),
        panel(
            "TTFT by turn (p50)",
            "s",
            "Client TTFT of session turns by turn (1: a session's first, which has nothing cached yet).",
            (quantile(0.5, m.SESSION_TTFT, "turn"), "turn {{turn}}"),
        ),
        panel(
            "TTFT by turn (p90)",
            "s",
            "The slow tail of each turn: where a session's prefix was not where its turn went.",
            (quantile(0.9, m.SESSION_TTFT, "turn"), "turn {{turn}}"),
        ),
        panel(
            "Prefix-cache hit rate",
            "percentunit",
            "Engines' prefix-cache hits over queries (prompt tokens), per role: what routing achieves.",
            (f"{hits} / {queries}", "{{role}}"),
        ),
        panel(
            "Router: expected overlap",
            "percentunit",
            "Leading prompt blocks the chosen engine held when chosen, over prompt blocks, per pool.",
            (f"{rate(m.ROUTED_OVERLAP_BLOCKS, 'pool')} / {rate(m.ROUTED_PROMPT_BLOCKS, 'pool')}", "{{pool}}"),
        ),
        panel(
            "Router decisions",
            "short",
            "Requests routed to each engine (per wall second): how evenly a policy spreads the load.",
            (rate(m.ROUTED, "pool, routed_to"), "{{pool}} -> {{routed_to}}"),
        ),
    ]
