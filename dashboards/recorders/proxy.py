"""The proxy's recorder: the client's view (latencies, the worst stall, SLOs, handoff parts, sessions)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dashboards.metrics import (
    CLIENT_E2E,
    CLIENT_TTFT,
    EC_TRANSFER,
    ENCODE,
    FINISHED_REASONS,
    KV_HANDOFF_PARTS,
    MAX_GAP,
    PROXY_SERIES,
    REQUESTS_FINISHED,
    ROUTED,
    ROUTED_OVERLAP_BLOCKS,
    ROUTED_PROMPT_BLOCKS,
    SESSION_TTFT,
    SESSIONS_ACTIVE,
    SLO_MET,
    TURN_BUCKETS,
    WORST_GAP,
)  # fmt: skip
from dashboards.recorders.registry import Registry
from messages.latency import HANDOFF_PARTS

if TYPE_CHECKING:
    from emulation.config import TestbedConfig
    from messages import RequestResult


class ProxyMetrics(Registry):
    """The client's view: latency through every role, the worst stall, SLO attainment and goodput."""

    def __init__(self, cfg: TestbedConfig, replica: int = 0) -> None:
        from workloads.slo import parse_slo

        super().__init__(PROXY_SERIES, cfg, "proxy", replica)
        self._slos = [parse_slo(s) for s in cfg.slos]
        for reason in FINISHED_REASONS:
            self.child(REQUESTS_FINISHED, finished_reason=reason)
        for slo in self._slos:
            self.child(SLO_MET, slo=slo.name)
        for part in HANDOFF_PARTS:
            self.child(KV_HANDOFF_PARTS, part=part)
        for turn in TURN_BUCKETS:
            self.child(SESSION_TTFT, turn=turn)
        self._worst_gap_s = 0.0
        self._sessions: dict[str, int] = {}
        """session id -> its requests in flight"""

    def on_routed(self, pool: str, engine_id: str, overlap_blocks: int, prompt_blocks: int) -> None:
        """A pool's router chose `engine_id`, which held `overlap_blocks` of the prompt's blocks."""
        self.child(ROUTED, pool=pool, routed_to=engine_id).inc()
        self.child(ROUTED_PROMPT_BLOCKS, pool=pool).inc(prompt_blocks)
        self.child(ROUTED_OVERLAP_BLOCKS, pool=pool).inc(overlap_blocks)

    def on_request_start(self, result: RequestResult) -> None:
        """The proxy took a request (its result so far: ids and session)."""
        if result.session_id is not None:
            self._sessions[result.session_id] = self._sessions.get(result.session_id, 0) + 1
            self.child(SESSIONS_ACTIVE).set(len(self._sessions))

    def _session_done(self, result: RequestResult, ttft_s: float) -> None:
        sid = result.session_id
        if sid is None:
            return
        left = self._sessions.get(sid, 1) - 1
        if left > 0:
            self._sessions[sid] = left
        else:
            self._sessions.pop(sid, None)
        self.child(SESSIONS_ACTIVE).set(len(self._sessions))
        if result.turn is not None and not math.isnan(ttft_s):
            self.child(SESSION_TTFT, turn=turn_bucket(result.turn)).observe(ttft_s)

    def on_request_done(self, result: RequestResult) -> None:
        """The proxy finished `result` (any outcome); the same figures as its row of the results table."""
        lat = result.latencies
        ok = result.finished_reason in ("length", "stop")
        self.child(REQUESTS_FINISHED, finished_reason=result.finished_reason or "error").inc()
        if not math.isnan(lat["ttft_s"]):
            self.child(CLIENT_TTFT).observe(lat["ttft_s"])
            self.child(CLIENT_E2E).observe(lat["e2el_s"])
        if not math.isnan(lat["max_gap_s"]):
            self.child(MAX_GAP).observe(lat["max_gap_s"])
            self._worst_gap_s = max(self._worst_gap_s, lat["max_gap_s"])
            self.child(WORST_GAP).set(self._worst_gap_s)
        for slo in self._slos:
            if slo.met(ok, lat):
                self.child(SLO_MET, slo=slo.name).inc()
        for part, seconds in (result.handoff_parts or {}).items():
            self.child(KV_HANDOFF_PARTS, part=part).observe(seconds)
        if result.encode_s > 0:
            self.child(ENCODE).observe(result.encode_s)
            self.child(EC_TRANSFER).observe(result.ec_transfer_s)
        self._session_done(result, lat["ttft_s"])


def turn_bucket(turn: int) -> str:
    """The `turn` label of a 0-based turn index (`TURN_BUCKETS`)."""
    n = turn + 1
    if n <= 2:
        return str(n)
    for bucket in TURN_BUCKETS[2:-1]:
        if n <= int(bucket.split("-")[1]):
            return bucket
    return TURN_BUCKETS[-1]
