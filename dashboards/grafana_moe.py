"""The roles board's MoE row (mixture-of-experts targets; empty for a dense one): each step's expert
load, expert-parallel imbalance and all-to-alls, and what dual-batch overlap hid, by role; under
attention-FFN disaggregation the bytes across the cut, the pipeline's bubbles, what the transfers
exposed and the FFN rank's utilisation."""

from __future__ import annotations

from grafana_foundation_sdk.builders import timeseries

from dashboards import metrics as m
from dashboards.grafana_panels import mean, panel, quantile, rate


def moe_panels() -> list[timeseries.Panel]:  # a table of panels, not logic
    return [
        panel(
            "Tokens per expert",
            "short",
            "Per step: the busiest routed expert's tokens (mean, p99) and the mean expert's (tokens x top_k "
            "/ experts), as the time model expects them under the routing skew.",
            (mean(m.MOE_MAX_TOKENS_PER_EXPERT, "role"), "busiest, mean {{role}}"),
            (quantile(0.99, m.MOE_MAX_TOKENS_PER_EXPERT, "role"), "busiest, p99 {{role}}"),
            (mean(m.MOE_MEAN_TOKENS_PER_EXPERT, "role"), "mean expert {{role}}"),
        ),
        panel(
            "EP imbalance",
            "none",
            "Per step: the busiest expert-parallel rank's token-expert assignments over the mean rank's "
            "(1: balanced; every rank waits for the busiest).",
            (mean(m.MOE_EP_IMBALANCE, "role"), "mean {{role}}"),
            (quantile(0.99, m.MOE_EP_IMBALANCE, "role"), "p99 {{role}}"),
        ),
        panel(
            "All-to-all per step",
            "s",
            "Every MoE layer's dispatch and combine in a step (data-parallel attention only).",
            (mean(m.MOE_ALL_TO_ALL, "role"), "mean {{role}}"),
            (quantile(0.99, m.MOE_ALL_TO_ALL, "role"), "p99 {{role}}"),
        ),
        panel(
            "All-to-all and DBO, share of busy time",
            "percentunit",
            "All-to-all seconds, and seconds dual-batch overlap hid under compute, per emulated busy second.",
            (f"{rate(m.MOE_ALL_TO_ALL.sum, 'role')} / {rate(m.BUSY, 'role')}", "all-to-all {{role}}"),
            (f"{rate(m.MOE_DBO_HIDDEN, 'role')} / {rate(m.BUSY, 'role')}", "hidden by DBO {{role}}"),
        ),
        *afd_panels(),
    ]


def afd_panels() -> list[timeseries.Panel]:  # a table of panels, not logic
    return [
        panel(
            "AFD: bytes across the cut",
            "Bps",
            "Hidden states to the FFN ranks (a2f) and back (f2a), all MoE layers, per emulated second.",
            (rate(m.AFD_TRANSFER_BYTES, "role, direction"), "{{direction}} {{role}}"),
        ),
        panel(
            "AFD: pipeline bubbles and exposed transfers",
            "s",
            "Per step: each side's idle time inside the micro-batch pipeline, and what the transfers added "
            "to the step (not hidden under compute).",
            (mean(m.AFD_BUBBLE, "role, side"), "{{side}} idle {{role}}"),
            (mean(m.AFD_EXPOSED, "role"), "exposed transfers {{role}}"),
        ),
        panel(
            "AFD: FFN utilisation",
            "percentunit",
            "Per step: the share the FFN rank serving the busiest attention rank computed (low: too few "
            "attention ranks feed it, or the link binds).",
            (mean(m.AFD_FFN_UTILIZATION, "role"), "mean {{role}}"),
            (quantile(0.1, m.AFD_FFN_UTILIZATION, "role"), "p10 {{role}}"),
        ),
    ]
