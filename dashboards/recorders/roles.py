"""The recorders of the render and encoder roles."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dashboards.metrics import (
    BUSY,
    ENCODER_JOBS_WAITING,
    ENCODER_SERIES,
    ENCODER_STEP_TOKENS,
    MM_CACHE_HITS,
    MM_CACHE_QUERIES,
    RENDER_CALLS,
    RENDER_CPU,
    RENDER_SERIES,
    RENDER_TOKENS,
    STEPS,
)  # fmt: skip
from dashboards.recorders.registry import Registry
from messages.stats import EncoderStats

if TYPE_CHECKING:
    from emulation.config import TestbedConfig


class RenderMetrics(Registry):
    """A render replica's series; `on_render` is the Render role's hook."""

    def __init__(self, cfg: TestbedConfig, replica: int) -> None:
        super().__init__(RENDER_SERIES, cfg, "render", replica)
        for op in ("render", "derender", "image"):
            for spec in RENDER_SERIES:
                self.child(spec, op=op)

    def on_render(self, op: str, cpu_s: float, num_tokens: int) -> None:
        """One render (op='render'), derender (op='derender') or image (op='image': decode, resize,
        hash; its visual tokens) took `cpu_s` of this thread's CPU."""
        self.child(RENDER_CPU, op=op).inc(cpu_s)
        self.child(RENDER_TOKENS, op=op).inc(num_tokens)
        self.child(RENDER_CALLS, op=op).inc()


class EncoderMetrics(Registry):
    """An encoder replica's series (E/P/D); the encoder calls the hooks."""

    def __init__(self, cfg: TestbedConfig, replica: int) -> None:
        super().__init__(ENCODER_SERIES, cfg, "encoder", replica)

    def on_encoder_step(self, num_visual_tokens: int, stats: EncoderStats) -> None:
        self.child(ENCODER_STEP_TOKENS).observe(num_visual_tokens)
        self._set_totals(stats)

    def on_encoder_state(self, num_waiting: int) -> None:
        self.child(ENCODER_JOBS_WAITING).set(num_waiting)

    def on_encoder_lookup(self, stats: EncoderStats) -> None:
        """A job's image looked up in the encoder's cache."""
        self._set_totals(stats)

    def _set_totals(self, stats: EncoderStats) -> None:
        """The counters, set to the encoder's own totals (the values the run's summary reads)."""
        self.child(STEPS).value = float(stats.num_steps)
        self.child(BUSY).value = stats.busy_s
        self.child(MM_CACHE_QUERIES).value = float(stats.num_mm_cache_queries)
        self.child(MM_CACHE_HITS).value = float(stats.num_mm_cache_hits)
