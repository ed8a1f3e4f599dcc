"""The recorders: each actor's registry of `dashboards.metrics` series, and the `on_<event>` hooks that are
the only way code records into it (engines, the proxy, render replicas).

Each actor owns a registry: a live actor serves it at `/metrics`, `testbed serve` merges those of its
in-process roles, and every run writes the final exposition beside its results.
"""

from dashboards.recorders.engine import EngineMetrics
from dashboards.recorders.proxy import ProxyMetrics
from dashboards.recorders.roles import EncoderMetrics, RenderMetrics

__all__ = ["EncoderMetrics", "EngineMetrics", "ProxyMetrics", "RenderMetrics"]
