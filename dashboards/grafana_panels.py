"""Building blocks of the Grafana boards: selectors with the boards' filters, rates, quantiles and a
time-series panel (grafana-foundation-sdk builders). Every expression names its series through
`dashboards.metrics`."""

from __future__ import annotations

from grafana_foundation_sdk.builders import common, prometheus, timeseries
from grafana_foundation_sdk.models.common import (
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from dashboards import metrics as m
from dashboards.metrics import MetricSpec

DATASOURCE = DataSourceRef(type_val="prometheus", uid="testbed-prometheus")
"""The provisioned datasource (dashboards/grafana/provisioning/datasources/testbed.yaml)."""
RATE = "$__rate_interval"


def sel(**labels: str) -> str:
    """A selector with the dashboard's filters (`$model_name`, `$design`) and `labels` (values that are
    variables match as regexes, so `All` = `.*` works)."""
    terms = [f'{k}=~"{v}"' if v.startswith("$") else f'{k}="{v}"' for k, v in labels.items()]
    terms += ['model_name=~"$model_name"', 'design=~"$design"']
    return "{" + ", ".join(terms) + "}"


ROLE = {"role": "$role"}
"""Rows repeat per role; a regex match also works with the variable's `All`."""
PER_SIM_S = f" * scalar(max({m.TIME_SCALE.name}{sel()}))"
"""Turns a per-wall-second rate into a per-emulated-second one."""


def rate(spec: MetricSpec | str, by: str = "", **labels: str) -> str:
    name = spec if isinstance(spec, str) else spec.exposed
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({name}{sel(**labels)}[{RATE}]))"


def quantile(q: float, spec: MetricSpec, by: str = "", **labels: str) -> str:
    return f"histogram_quantile({q}, {rate(spec.bucket, ', '.join(['le', *filter(None, [by])]), **labels)})"


def mean(spec: MetricSpec, by: str = "", **labels: str) -> str:
    return f"{rate(spec.sum, by, **labels)} / {rate(spec.count, by, **labels)}"


_LEGEND = (
    common.VizLegendOptions()
    .display_mode(LegendDisplayMode.LIST)
    .placement(LegendPlacement.BOTTOM)
    .show_legend(True)
)
_TOOLTIP = common.VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING)


def panel(title: str, unit: str, desc: str, *queries: tuple[str, str], w: int = 12) -> timeseries.Panel:
    p = timeseries.Panel().title(title).description(desc).unit(unit).datasource(DATASOURCE)
    p = p.height(8).span(w).legend(_LEGEND).tooltip(_TOOLTIP)
    for i, (expr, legend) in enumerate(queries):
        p = p.with_target(
            prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i)).range()
        )
    return p
