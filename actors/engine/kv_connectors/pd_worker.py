"""The KV connector's worker side (`kv_connector` describes both halves): reads held KV out of the runner
for a peer, pulls a peer's KV into this engine's blocks and tells the peer it may free it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from actors.engine.clock import Clock
from actors.engine.kv_cache.coordinator import KVCacheCoordinator
from actors.engine.kv_connectors.faults import KVLoadFaults
from actors.engine.kv_connectors.transfer import Link, LinkQueue, TransferPlan
from actors.engine.request import Request, RequestStatus
from actors.engine.runner.executor import Executor
from actors.engine.stats import EngineStats
from messages import KVPayload, KVPull


class KVSource(Protocol):
    """What a decode engine needs of a prefill engine (the engine itself, or a handle to its actor)."""

    async def get_kv(self, pull: KVPull) -> KVPayload:
        """The held KV `pull` asks for, queued on this engine's link."""
        ...

    async def free_kv(self, request_id: str) -> None: ...


class KVLoadError(RuntimeError):
    """The prefill side died or lost the KV: the request fails, visibly."""


class KVNotHeldError(LookupError):
    """The source engine holds no KV for a pull: freed, expired, released for room, or never held."""


class PDConnectorWorker:
    def __init__(
        self,
        engine_id: str,
        executor: Executor,
        *,
        peers: Mapping[str, KVSource],
        stats: EngineStats,
        clock: Clock,
        kv_cache: KVCacheCoordinator,
        link: Link | None = None,
        faults: KVLoadFaults | None = None,
    ) -> None:
        """`peers`: the prefill engines by id (the engines, or clients of their actors); `kv_cache`: the
        engine's (where a request's blocks and recurrent state are); `link`: the
        link this engine sends on (kv_transfer.link_scope=fabric: shared; None: its own, one wire);
        `faults`: which of this engine's loads fail on purpose (None: none)."""
        self.engine_id = engine_id
        self.faults = faults
        self.link: Link = link if link is not None else LinkQueue()
        """Prefill side: the link every pull from this engine queues on."""
        self.executor = executor
        self.peers = peers
        self.stats = stats
        self.clock = clock
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size

    async def read(self, req: Request, pull: KVPull) -> KVPayload:
        """A held request's KV from the pull's first block (its prompt's; a pull back: the blocks it
        asks for) and a hybrid's SSM state, queued on this engine's link."""
        first = pull.first_block
        if pull.num_blocks is None:
            block_ids, num_tokens = req.block_ids[first:], req.num_prompt_tokens - first * self.block_size
        else:
            block_ids, num_tokens = (
                req.block_ids[first : first + pull.num_blocks],
                pull.num_blocks * self.block_size,
            )
        kv = self.executor.read_kv(block_ids, num_tokens)
        state = self.executor.read_state(self.kv_cache.state_block(req))
        return KVPayload(req.request_id, kv, await self.link.reserve(pull.start_s, pull.wire_s), state)

    async def load(self, req: Request, plan: TransferPlan) -> bool:
        """Fetch `req`'s KV from its prefill engine and write it into `req`'s blocks; False if `req` was
        aborted meanwhile (it notified its prefill engine when it ended)."""
        if self.faults is not None and self.faults.next_fails():
            return await self._fail(req, plan)
        payload = await self._fetch(req, plan)
        if req.status is not RequestStatus.WAITING_FOR_REMOTE_KVS:
            return False
        self._write(req, payload, plan.queued(payload.wire_start_s))
        return True

    async def _fetch(self, req: Request, plan: TransferPlan) -> KVPayload:
        """Read `req`'s KV from the prefill engine its kv_transfer_params name."""
        params = req.kv_transfer_params
        assert params is not None
        remote_id, remote_request_id = params.remote_engine_id, params.remote_request_id
        assert remote_id is not None and remote_request_id is not None
        try:
            num_blocks = plan.num_blocks if req.is_pull_back else None
            pull = KVPull(remote_request_id, plan.first_block, plan.start_s, plan.time.wire_s, num_blocks)
            return await self.peers[remote_id].get_kv(pull)
        except Exception as e:
            self.stats.on_kv_transfer_failed()
            # Its first sentence names the engines and the cause, the same for every request alike.
            source = "decode" if req.is_pull_back else "prefill"
            why = f"{source} no longer held it" if isinstance(e, KVNotHeldError) else _plain(e)
            raise KVLoadError(
                f"{self.engine_id} could not pull KV from {remote_id}: {why}. Request {remote_request_id!r}."
            ) from e

    async def _fail(self, req: Request, plan: TransferPlan) -> bool:
        """An injected failure: the transfer takes its time (unqueued) and is found broken at its end,
        as NIXL reports a failed read on completion; the sender is told to free what it held (this
        engine reads it no more). False if `req` was aborted meanwhile."""
        await self.clock.sleep_until(plan.start_s + plan.time.total_s)
        await self.notify_done(req)
        if req.status is not RequestStatus.WAITING_FOR_REMOTE_KVS:
            return False
        self.stats.on_kv_transfer_failed(injected=True)
        raise KVLoadError(
            f"{self.engine_id} could not load KV: failed on purpose (faults). Request {req.request_id!r}."
        )

    def _write(self, req: Request, payload: KVPayload, plan: TransferPlan) -> None:
        """Put fetched KV into `req`'s blocks; counts the transfer (late if the real move ended after
        the emulated one)."""
        assert req.kv_transfer_params is not None
        req.times.handoff.kv_transfer_done_s = plan.done_s
        req.times.handoff.kv_wire_start_s = plan.wire_start_s
        req.times.handoff.kv_wire_s = plan.time.wire_s
        self.executor.write_kv(req.block_ids[plan.first_block :], payload.kv)
        # a recurrent state (a hybrid's SSM state), as of the last token prefill computed
        self.executor.write_state(self.kv_cache.state_block(req), payload.state)
        xfer_s = plan.done_s - plan.start_s
        overrun_s = self.clock.now() - plan.done_s
        self.stats.on_kv_transfer_done(
            xfer_s, plan.time.overhead_s, plan.kv_bytes, plan.num_blocks, overrun_s, plan.state_bytes
        )

    async def notify_done(self, req: Request) -> None:
        """Tell the prefill side it may free `req`'s KV (NIXL's completion notification); a dead peer has
        nothing to free."""
        params = req.kv_transfer_params
        assert params is not None and params.remote_engine_id is not None
        assert params.remote_request_id is not None
        try:
            await self.peers[params.remote_engine_id].free_kv(params.remote_request_id)
        except Exception:
            self.stats.on_kv_notification_failed()


def _plain(e: Exception) -> str:
    """`e` in words: its message's first line, else its kind (no Python repr)."""
    lines = str(e).strip().splitlines()
    return lines[0].rstrip(".") if lines else type(e).__name__
