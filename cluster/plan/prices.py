"""What a GPU costs per hour, for ranking designs by goodput per dollar.

Defaults are on-demand list prices per GPU-hour at specialised GPU clouds (not hyperscalers, not
reserved or spot), the middle of the ranges these pages quoted; prices move month to month and
differ 2-3x between providers, so `--price GPU=USD` overrides any of them:

    l40s       1.29  modal.com/blog/nvidia-l40s-price-article (Aug 2025: Civo 1.29, RunPod 0.86,
                     AWS g6e 1.86, CoreWeave 2.25)
    a100-80gb  1.30  mercatus-ai.com/blog/cloud-gpu-pricing (May 2026: specialty 1.10-1.50)
    h100-sxm   3.00  same page (specialty 2.50-3.50)
    h200       4.00  same page (specialty 3.50-4.50)
    b200       5.25  lyceum.technology, B200 cloud pricing 2026 (Mar 2026: specialised 4.50-6.00)

The H800 and the Ascend 910C have no public on-demand price in reach: give one to rank by cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from emulation.profiles import GPUS

DEFAULT_USD_PER_GPU_HOUR: dict[str, float] = {
    "l40s": 1.29,
    "a100-80gb": 1.30,
    "h100-sxm": 3.00,
    "h200": 4.00,
    "b200": 5.25,
}


class PriceError(ValueError):
    pass


def parse_prices(items: Sequence[str]) -> dict[str, float]:
    """The default table with `GPU=USD` overrides applied."""
    prices = dict(DEFAULT_USD_PER_GPU_HOUR)
    for item in items:
        gpu, sep, value = item.partition("=")
        gpu = gpu.strip()
        if gpu not in GPUS:
            raise PriceError(f"--price: GPU {gpu!r} in {item!r} is unknown; allowed: {', '.join(GPUS)}")
        try:
            usd = float(value) if sep else float("nan")
        except ValueError:
            usd = float("nan")
        if not (usd > 0 and math.isfinite(usd)):
            raise PriceError(f"--price: {item!r} needs GPU=USD_PER_HOUR with a price > 0, e.g. h200=3.5")
        prices[gpu] = usd
    return prices


def usd_per_hour(gpus: Mapping[str, int], prices: Mapping[str, float]) -> float | None:
    """The hourly price of `gpus` (GPU name -> count); None if one of them has no price."""
    if any(g not in prices for g in gpus):
        return None
    return sum(prices[g] * n for g, n in gpus.items())
