"""An engine's actor body (`EngineHost`) and the clients that stand for it, its link and the shared KV
store (`RemoteEngine`, `RemoteLink`, `RemoteKVStore`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import Any

import numpy as np
import ray

from actors.engine.clock import Clock
from actors.engine.core import EngineCore, Role
from actors.engine.health import EngineDeadError
from actors.engine.kv_cache.block_hash import BlockHash
from actors.engine.kv_connectors.pd_worker import KVSource
from cluster.clock_sync import Probe, probe
from cluster.engines import build_engine, runner_for
from cluster.hosts.common import remote_stream, serve_node_metrics
from cluster.hosts.ffn import RemoteFfnRanks
from dashboards.recorders import EngineMetrics
from emulation.config import PoolConfig, TestbedConfig
from emulation.time_model import time_model_for
from messages import (
    EngineOutput,
    EngineRequest,
    KVPayload,
    KVPull,
    KVStoreChanges,
    KVTransferParams,
)
from messages.stats import EngineReport


class RemoteEngine:
    """An engine actor seen as a plain engine: the proxy's EngineClient and a decode's KVSource."""

    def __init__(self, engine_id: str, handle: Any) -> None:
        self.engine_id = engine_id
        self._handle = handle

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        with self._dead_as_engine_dead():
            async for out in remote_stream(self._handle.generate, request):
                yield out

    async def get_kv(self, pull: KVPull) -> KVPayload:
        with self._dead_as_engine_dead():
            payload: KVPayload = await self._handle.get_kv.remote(pull)
        return payload

    async def free_kv(self, request_id: str) -> None:
        await self._handle.free_kv.remote(request_id)

    async def check_health(self) -> None:
        with self._dead_as_engine_dead():
            await self._handle.check_health.remote()

    async def kv_ready(self, request_id: str, kv_transfer_params: KVTransferParams) -> None:
        with self._dead_as_engine_dead():
            await self._handle.kv_ready.remote(request_id, kv_transfer_params)

    @contextlib.contextmanager
    def _dead_as_engine_dead(self) -> Iterator[None]:
        """A dead actor's error as the engine's own (`EngineDeadError`): the proxy retries a prefill
        elsewhere and stops routing to it, as in virtual mode."""
        try:
            yield
        except ray.exceptions.RayActorError as e:
            raise EngineDeadError(f"engine {self.engine_id} died: {type(e).__name__}") from e


class RemoteLink:
    """The shared link's actor (kv_transfer.link_scope=fabric) seen as a `Link`: one call per transfer."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    async def reserve(self, start_s: float, wire_s: float) -> float:
        wire_start_s: float = await self._handle.reserve.remote(start_s, wire_s)
        return wire_start_s


class RemoteKVStore:
    """The shared KV store's actor seen as a `KVStoreClient`: one call per store or load of a request."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    async def put(
        self, engine_id: str, hashes: Sequence[BlockHash], kvs: Sequence[np.ndarray | None], ready_s: float
    ) -> KVStoreChanges:
        changes: KVStoreChanges = await self._handle.put.remote(engine_id, hashes, kvs, ready_s)
        return changes

    async def get(
        self, engine_id: str, hashes: Sequence[BlockHash]
    ) -> tuple[list[np.ndarray | None], KVStoreChanges]:
        got: tuple[list[np.ndarray | None], KVStoreChanges] = await self._handle.get.remote(engine_id, hashes)
        return got

    async def changes(self, engine_id: str) -> KVStoreChanges:
        changes: KVStoreChanges = await self._handle.changes.remote(engine_id)
        return changes


class EngineHost:
    """The body of an engine actor: builds the runner at construction, the engine on the actor's loop."""

    def __init__(
        self,
        engine_id: str,
        role: Role,
        replica: int,
        cfg: TestbedConfig,
        pool: PoolConfig,
        prefill: dict[str, Any],
        link: Any = None,
        ffn: Sequence[Any] = (),
        kv_store: Any = None,
    ) -> None:
        """`prefill`: the prefill engines' actors by id (a decode engine's peers); `link`: the shared
        link's actor a prefill engine sends on (kv_transfer.link_scope=fabric), None: its own; `ffn`:
        its FFN ranks' actors (AFD with real compute: `hosts.ffn.ffn_actors`); `kv_store`: the shared KV
        store's actor (kv_offload.shared_gb > 0)."""
        self._kv_store = RemoteKVStore(kv_store) if kv_store is not None else None
        self._args = (engine_id, role, cfg, pool)
        self._link = RemoteLink(link) if link is not None else None
        self._flush_s = cfg.clock.stream_flush_wall_s
        assert self._flush_s is not None  # resolved by live.deploy
        self._prefill = prefill
        self._runner = runner_for(cfg, pool, RemoteFfnRanks(ffn) if ffn else None)
        if self._runner is not None:
            self._runner.warm_up()
        self._time_model = time_model_for(cfg, pool)  # before the clock starts (measured: opens tables)
        self._metrics = EngineMetrics(cfg, role, replica)
        self.engine: EngineCore | None = None

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())

    def add_peers(self, engines: dict[str, Any]) -> None:
        """More engines this one pulls from (bidirectional: a prefill engine pulls back from decode
        engines, which exist only after it); call before `start`."""
        self._prefill.update(engines)

    def clock_probe(self) -> Probe:
        return probe()

    async def start(self, epoch_s: float, offset_s: float) -> str:
        """Start the engine on the shared clock (`offset_s`: this process's monotonic clock less the
        head's) and its /metrics endpoint; returns `host:port` of it."""
        engine_id, role, cfg, pool = self._args
        peers: dict[str, KVSource] = {eid: RemoteEngine(eid, h) for eid, h in self._prefill.items()}
        clock = Clock(cfg.clock.scale, epoch_s=epoch_s, offset_s=offset_s)
        self.engine = build_engine(
            engine_id, role, cfg, pool, clock, self._runner, peers, self._metrics, True, self._link,
            time_model=self._time_model, kv_store=self._kv_store,
        )  # fmt: skip
        self.engine.start()
        return serve_node_metrics(self._metrics.registry)

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineOutput, None]:
        assert self.engine is not None
        async for out in self.engine.generate(request):
            yield out
            if out.finished_reason is None and self._flush_s:
                await asyncio.sleep(self._flush_s)

    async def get_kv(self, pull: KVPull) -> KVPayload:
        assert self.engine is not None
        return await self.engine.get_kv(pull)

    async def free_kv(self, request_id: str) -> None:
        assert self.engine is not None
        await self.engine.free_kv(request_id)

    async def kv_ready(self, request_id: str, kv_transfer_params: KVTransferParams) -> None:
        assert self.engine is not None
        await self.engine.kv_ready(request_id, kv_transfer_params)

    async def report(self) -> EngineReport:
        assert self.engine is not None
        return self.engine.report()

    async def check_health(self) -> None:
        assert self.engine is not None
        await self.engine.check_health()

    async def hang(self, why: str) -> None:
        assert self.engine is not None
        self.engine.inject("hang", why)

    async def metrics(self) -> str:
        return self._metrics.exposition()

    async def drain(self) -> EngineReport:
        """Stop the step loop, release KV nobody will pull, check nothing is left; the final report."""
        assert self.engine is not None
        await self.engine.drain()
        self.engine.assert_empty()
        return self.engine.report()
