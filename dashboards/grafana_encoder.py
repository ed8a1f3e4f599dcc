"""The roles board's encoder row (E/P/D): the encoder pool's load, batches, cache, and the wait it adds."""

from __future__ import annotations

from grafana_foundation_sdk.builders import timeseries

from dashboards import metrics as m
from dashboards.grafana_panels import PER_SIM_S, panel, quantile, rate, sel

ENCODER = {"role": "encoder"}


def encoder_panels() -> list[timeseries.Panel]:  # a table of panels, not logic
    hits, queries = rate(m.MM_CACHE_HITS, "", **ENCODER), rate(m.MM_CACHE_QUERIES, "", **ENCODER)
    return [
        panel(
            "Encoder utilisation",
            "percentunit",
            "Emulated busy time per emulated second, per encoder replica.",
            (rate(m.BUSY, "replica", **ENCODER) + PER_SIM_S, "{{replica}}"),
            w=8,
        ),
        panel(
            "Images waiting",
            "short",
            "Images queued on each encoder replica.",
            (f"max by (replica) ({m.ENCODER_JOBS_WAITING.name}{sel(**ENCODER)})", "{{replica}}"),
            w=8,
        ),
        panel(
            "Visual tokens per step",
            "short",
            "Visual tokens an encoder step encodes (its budget: max_num_batched_encoder_embeds).",
            *[(quantile(q, m.ENCODER_STEP_TOKENS, **ENCODER), f"p{round(q * 100)}") for q in (0.5, 0.99)],
            w=8,
        ),
        panel(
            "Encoder cache hit rate",
            "percentunit",
            "Images found in the encoders' caches (encoded before: no encoder time) over images asked.",
            (f"{hits} / {queries}", "hit rate"),
            w=8,
        ),
        panel(
            "Wait for images (proxy)",
            "s",
            "From rendered to the last embedding on prefill: encoder queue, encoding, EC transfer.",
            *[(quantile(q, m.ENCODE), f"p{round(q * 100)}") for q in (0.5, 0.99)],
            w=8,
        ),
        panel(
            "EC transfer (proxy)",
            "s",
            "Of that wait, the last-landing image's embeddings moving encoder -> prefill (ec_transfer.link).",
            *[(quantile(q, m.EC_TRANSFER), f"p{round(q * 100)}") for q in (0.5, 0.99)],
            w=8,
        ),
    ]
