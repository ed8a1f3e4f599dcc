"""What the model runner can compute: checked before any weights load.

The runner does its own attention plumbing (`runner_layers.py`): q/k/v projections (Qwen2's with
biases), Qwen3's per-head RMSNorm of q and k before the rotary embedding, grouped-query attention over
every earlier token; and it routes the packed batch through Qwen3-MoE's sparse blocks (router, then
experts). Nemotron-H (`hybrid_runner.py`) runs its Mamba2 mixers per request with their state kept
between steps, and its attention (no rotary embedding) as above. Another architecture's checkpoint
would load and run, and may compute silently wrong (Mistral-style models slide a window; other MoE
blocks add shared experts or route otherwise). So a model is refused unless its `config.json` names
a supported architecture and no sliding window. Reads JSON only: the config edge checks it without
loading torch.
"""

from __future__ import annotations

import json
from pathlib import Path

SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "Qwen3MoeForCausalLM", "NemotronHForCausalLM")


class UnsupportedModelError(ValueError):
    """A model directory the runner cannot compute correctly (one line for the user)."""


def check_runner_model(model_path: str) -> None:
    """Raise UnsupportedModelError unless `model_path` holds a model the runner supports."""
    where = f"runner.model_path={model_path!r}"
    allowed = f"allowed: {', '.join(SUPPORTED_ARCHITECTURES)}"
    config_file = Path(model_path) / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as e:
        raise UnsupportedModelError(f"{where}: no readable config.json ({e}); {allowed}") from None
    found = config.get("architectures") or [config.get("model_type", "unknown")]
    unsupported = [a for a in found if a not in SUPPORTED_ARCHITECTURES]
    if unsupported:
        raise UnsupportedModelError(
            f"{where}: architecture {', '.join(map(str, unsupported))} is not supported by the runner; "
            f"{allowed}"
        )
    if config.get("use_sliding_window"):
        raise UnsupportedModelError(
            f"{where}: use_sliding_window=true is not supported by the runner (it attends to every "
            f"earlier token); {allowed} without a sliding window"
        )
