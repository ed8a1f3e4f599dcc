"""How far a run's figures can be trusted: the errors the same time model made on the held-out public
silicon rows nearest its target (`bench/silicon_validation.py`, docs/validation.md).

Nearest means the same GPU family (by compute capability: Ampere, Ada, Hopper, Blackwell), the same
model kind (dense, moe, mla-moe, hybrid) and the same mode (aggregated, or disaggregated prefill and
decode). The bench writes, per time model and such group, the held-out rows it predicted and their
median absolute and signed percentage errors (`data/silicon_errors.json`, shipped with the package);
a target with no such rows is "not validated". Nothing here is fitted: the figures are the bench's.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emulation.gpu_profile import GpuProfile
from emulation.model_profile import ModelProfile

SILICON_ERRORS = Path(__file__).parent / "data" / "silicon_errors.json"
"""The held-out errors, by time model and group (written by `bench/silicon_validation.py`)."""
FAMILIES = ((100, "Blackwell"), (90, "Hopper"), (89, "Ada"), (80, "Ampere"))
"""GPU families by the least compute capability (x 10) of each."""
MODES = {"agg": "aggregated", "disagg": "disaggregated"}


def gpu_family(gpu: GpuProfile) -> str:
    """The GPU's family by its compute capability (its own name where that is unknown: Ascend)."""
    sm = gpu.sm_version
    return next((name for least, name in FAMILIES if sm is not None and sm >= least), gpu.name)


def model_kind(model: ModelProfile) -> str:
    """dense, moe, mla-moe (DeepSeek's latent attention) or hybrid (SSM or linear-attention layers)."""
    if model.ssm is not None:
        return "hybrid"
    if model.moe is None:
        return "dense"
    return "mla-moe" if model.mla is not None else "moe"


@dataclass(frozen=True)
class Trust:
    """The held-out silicon rows nearest a target, and how far the time model missed them."""

    time_model: str
    gpu_family: str
    model_kind: str
    mode: str
    """agg or disagg."""
    num_rows: int = 0
    ttft_mdape: float | None = None
    """Median absolute percentage error of mean TTFT (None: no rows)."""
    tpot_mdape: float | None = None
    ttft_bias: float | None = None
    """Median signed percentage error (negative: the testbed is faster than the silicon)."""
    tpot_bias: float | None = None

    @property
    def line(self) -> str:
        """One sentence: typical errors and the rows behind them, or "not validated"."""
        what = f"{self.model_kind} on {self.gpu_family}, {MODES[self.mode]}, {self.time_model} time model"
        if not self.num_rows or self.ttft_mdape is None or self.tpot_mdape is None:
            return f"not validated: no held-out silicon rows for {what}"
        return (
            f"TTFT typically within ±{self.ttft_mdape:.0f} % (median {self.ttft_bias:+.0f} %), TPOT within "
            f"±{self.tpot_mdape:.0f} % (median {self.tpot_bias:+.0f} %) for {what}: "
            f"{self.num_rows:,} held-out silicon rows"
        )


def trust_of(time_model: str, gpu: GpuProfile, model: ModelProfile, disaggregated: bool) -> Trust:
    """What the held-out rows nearest this target say of `time_model`."""
    key = (time_model, gpu_family(gpu), model_kind(model), "disagg" if disaggregated else "agg")
    found = _errors().get(key)
    return Trust(*key, **found) if found else Trust(*key)


@functools.cache
def _errors() -> dict[tuple[str, str, str, str], dict[str, Any]]:
    if not SILICON_ERRORS.exists():
        return {}
    rows = json.loads(SILICON_ERRORS.read_text())["groups"]
    keys = ("time_model", "gpu_family", "model_kind", "mode")
    return {tuple(r[k] for k in keys): {k: v for k, v in r.items() if k not in keys} for r in rows}  # type: ignore[misc]
