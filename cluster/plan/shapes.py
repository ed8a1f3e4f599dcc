"""Pool shapes: how many engines a design runs, the P:D ratio of a disaggregated one.

    --shapes c1,c2,p1d1,p1d2     collocated designs take the c shapes (`cN`: N engines),
                                 P/D designs the p shapes (`pPdD`: P prefill, D decode engines)
    --shapes auto                every shape whose GPUs fit --max-gpus, each design its own kind

A shape keeps the design's GPU, TP and EP per engine and changes only its replica counts, so a
P/D design's link, mode and router stay as the design has them. A design with none of the listed
shapes of its kind is searched as it is.
"""

from __future__ import annotations

import re

from cluster.config_load import ConfigError
from emulation.config import TestbedConfig

Shape = tuple[str, tuple[str, ...]]
"""(label, the `--set` overrides it makes)."""
_SHAPE = re.compile(r"^(?:c(\d+)|p(\d+)d(\d+))$")


def parse_shapes(text: str, max_gpus: int | None) -> list[tuple[int, int, int]] | None:
    """(mixed, prefill, decode) replica counts; None for `auto` (every shape within the budget)."""
    if text.strip() == "auto":
        if max_gpus is None:
            raise ConfigError("--shapes auto: needs --max-gpus N, the budget the shapes fill")
        return None
    out = []
    for item in text.split(","):
        m = _SHAPE.match(item.strip())
        counts = [int(g) for g in m.groups() if g is not None] if m else []
        if not m or not all(counts):
            raise ConfigError(
                f"--shapes: {item.strip()!r} in {text!r} is not a shape; allowed: cN (N collocated "
                "engines), pPdD (P prefill and D decode engines), N >= 1, or auto"
            )
        out.append((counts[0], 0, 0) if len(counts) == 1 else (0, counts[0], counts[1]))
    return out


def shapes_for(
    cfg: TestbedConfig, wanted: list[tuple[int, int, int]] | None, max_gpus: int | None
) -> list[Shape]:
    """The shapes of `wanted` (None: all within `max_gpus`) of `cfg`'s kind, collocated or P/D."""
    pools = cfg.pools
    disaggregated = pools.prefill.replicas > 0
    if wanted is None:
        assert max_gpus is not None  # parse_shapes asks for it
        if disaggregated:
            p_gpus, d_gpus = pools.prefill.num_gpus, pools.decode.num_gpus
            wanted = [
                (0, p, d)
                for p in range(1, max_gpus // p_gpus + 1)
                for d in range(1, max_gpus // d_gpus + 1)
                if p * p_gpus + d * d_gpus <= max_gpus
            ]
        else:
            wanted = [(n, 0, 0) for n in range(1, max_gpus // pools.mixed.num_gpus + 1)]
    shapes: list[Shape] = []
    for mixed, prefill, decode in wanted:
        if disaggregated and prefill:
            label = f"p{prefill}d{decode}"
            shapes.append((label, (f"pools.prefill.replicas={prefill}", f"pools.decode.replicas={decode}")))
        elif not disaggregated and mixed:
            shapes.append((f"c{mixed}", (f"pools.mixed.replicas={mixed}",)))
    return shapes or [("", ())]
