"""The search space: every design of the source, crossed with the axes the user varies.

    --vary scheduler.max_num_batched_tokens=2048,4096      every design, each value
    --vary pd-fast:kv_transfer.link=rdma-400g,guide-testbox one design only
    --set KEY=VALUE                                         pins a field for all (as elsewhere)

A combination the config rules refuse (a P/D field on a collocated design, a pool that cannot hold
one request's KV) is left out and listed with the rule's own line; a candidate over the GPU budget
too. An empty space is an error.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cluster.config_load import ConfigError, load_designs
from cluster.plan.prices import usd_per_hour
from cluster.plan.shapes import Shape
from emulation.config import TestbedConfig


@dataclass(frozen=True)
class Axis:
    key: str
    """A dotted config key (`scheduler.max_num_batched_tokens`)."""
    values: tuple[str, ...]
    """YAML texts, as `--set` takes them."""
    design: str | None = None
    """Only this design varies along it; None: every design."""

    @property
    def label(self) -> str:
        """How a candidate's name shows it: the key without its section (`max_num_batched_tokens`,
        `prefill.replicas`)."""
        parts = self.key.split(".")
        return ".".join(parts[1:]) if len(parts) > 1 else self.key


@dataclass(frozen=True)
class Candidate:
    name: str
    """The design and the axis values that made it (`pd-fast max_num_batched_tokens=4096`)."""
    cfg: TestbedConfig
    settings: tuple[str, ...] = field(default=())
    """The `KEY=VALUE` overrides beyond the design's own, pins first."""

    @property
    def gpus(self) -> dict[str, int]:
        """GPU name -> GPUs the candidate's pools take."""
        return self.cfg.pools.gpus

    @property
    def num_gpus(self) -> int:
        return self.cfg.pools.num_gpus

    def score(self, load: float, prices: Mapping[str, float], by_cost: bool) -> float:
        """What the search ranks by: `load` per GPU, or per dollar an hour (every GPU priced)."""
        if not by_cost:
            return load / self.num_gpus
        usd = usd_per_hour(self.gpus, prices)
        assert usd is not None  # cost ranking requires every GPU priced (checked at the edge)
        return load / usd

    @property
    def ray_units(self) -> dict[str, int]:
        """The custom resource units live mode asks a Ray cluster for, one per emulated GPU, by pool
        resource (`mixed`, `prefill`, `decode`; `ffn` for AFD's FFN ranks): what a `ray up` cluster
        file's worker types must offer to host it."""
        out: dict[str, int] = {}
        for role, pool in self.cfg.pools.by_role():
            if not pool.replicas:
                continue
            if pool.afd is not None:
                ffn = pool.replicas * pool.afd.num_ffn_ranks * pool.afd.ffn_gpus_per_rank
                out["ffn"] = out.get("ffn", 0) + ffn
                out[role] = pool.replicas * pool.afd.num_attention_ranks * pool.tp
            else:
                out[role] = pool.replicas * pool.ep * pool.tp
        return out


def parse_axis(text: str, designs: Sequence[str]) -> Axis:
    key, sep, values = text.partition("=")
    design, colon, dotted = key.strip().rpartition(":")
    if not sep or not dotted or not values.strip():
        raise ConfigError(f"--vary: {text!r} is malformed; expected [DESIGN:]dotted.key=V1,V2,...")
    if colon and design not in designs:
        raise ConfigError(f"--vary: design {design!r} in {text!r} is not one of: {', '.join(designs)}")
    items = tuple(v.strip() for v in values.split(","))
    if any(not v for v in items):
        raise ConfigError(f"--vary: {text!r} has an empty value")
    if len(set(items)) < len(items):
        raise ConfigError(f"--vary: {text!r} repeats a value")
    return Axis(dotted, items, design if colon else None)


def build_space(
    source: str,
    designs: Sequence[str],
    pins: Sequence[str],
    axes: Sequence[Axis],
    max_gpus: int | None,
    shapes: Mapping[str, list[Shape]] | None = None,
) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """The candidates in a stable order (designs, their shapes, then axis values as given), and those
    left out with why. `shapes`: each design's pool shapes (`cluster.plan.shapes`); none: as it is."""
    candidates, left_out = [], []
    for design in designs:
        mine = [a for a in axes if a.design in (None, design)]
        for (shape, shaped), values in itertools.product(
            (shapes or {}).get(design, [("", ())]), itertools.product(*(a.values for a in mine))
        ):
            settings = (*shaped, *(f"{a.key}={v}" for a, v in zip(mine, values, strict=True)))
            labels = [f"{a.label}={v}" for a, v in zip(mine, values, strict=True)]
            name = " ".join([design, *([shape] if shape else []), *labels])
            try:
                (cfg,) = load_designs(source, [design], [*pins, *settings])
            except ConfigError as e:
                left_out.append((name, str(e)))
                continue
            cand = Candidate(name, cfg, (*pins, *settings))
            if max_gpus is not None and cand.num_gpus > max_gpus:
                left_out.append((name, f"takes {cand.num_gpus} GPUs, over --max-gpus {max_gpus}"))
                continue
            candidates.append(cand)
    if not candidates:
        why = "; ".join(f"{n}: {r}" for n, r in left_out[:3]) or "no design"
        raise ConfigError(f"search space: empty, every candidate was left out ({why})")
    return candidates, left_out
