"""An encoder's actor body (`EncoderHost`) and its client (`RemoteEncoder`)."""

from __future__ import annotations

from typing import Any

from actors.encoder.encoder import EncoderCore
from actors.engine.clock import Clock
from cluster.clock_sync import Probe, probe
from cluster.engines import build_encoder
from cluster.hosts.common import serve_node_metrics
from dashboards.recorders import EncoderMetrics
from emulation.config import TestbedConfig
from messages import (
    EncodedImage,
    EncodeJob,
)
from messages.stats import EncoderStats


class EncoderHost:
    """The body of an encoder actor (E/P/D): the encoder on the actor's loop, from `start`."""

    def __init__(self, encoder_id: str, replica: int, cfg: TestbedConfig) -> None:
        self._args = (encoder_id, cfg)
        self._metrics = EncoderMetrics(cfg, replica)
        self.encoder: EncoderCore | None = None

    def clock_probe(self) -> Probe:
        return probe()

    def start(self, epoch_s: float, offset_s: float) -> str:
        """Start the encoder on the shared clock and its /metrics endpoint; returns `host:port` of it."""
        encoder_id, cfg = self._args
        clock = Clock(cfg.clock.scale, epoch_s=epoch_s, offset_s=offset_s)
        self.encoder = build_encoder(encoder_id, cfg, clock, True, self._metrics)
        self.encoder.start()
        return serve_node_metrics(self._metrics.registry)

    def metrics(self) -> str:
        return self._metrics.exposition()

    async def encode(self, job: EncodeJob) -> EncodedImage:
        assert self.encoder is not None
        return await self.encoder.encode(job)

    async def drain(self) -> EncoderStats:
        """Stop the step loop, check nothing is left; the encoder's final totals."""
        assert self.encoder is not None
        await self.encoder.drain()
        self.encoder.assert_empty()
        return self.encoder.stats()


class RemoteEncoder:
    """An encoder actor, as the proxy's encoder pool calls it."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    async def encode(self, job: EncodeJob) -> EncodedImage:
        done: EncodedImage = await self._handle.encode.remote(job)
        return done
