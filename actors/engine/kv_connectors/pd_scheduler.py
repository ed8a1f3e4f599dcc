"""The KV connector, in the two halves vLLM's `KVConnectorBase_V1` has (here: NIXL-style P/D).

    scheduler side   what to load and what to save: plans a decode request's pull once it has its blocks,
    (PDConnectorScheduler)  notices finished loads at step boundaries, describes a finished prefill's KV
                     (`kv_transfer_params`) and holds it until decode has pulled it or it expires
    worker side      moving it: reads held KV out of the runner for a peer, pulls a peer's KV into this
    (PDConnectorWorker,     engine's blocks and tells the peer it may free it
     kv_connector_worker.py)

A handoff, decode side (pull mode)::

    admitted (blocks allocated) ── start_load ── peer.get_kv ── write into blocks ── loaded
        ... notice_loaded at the first step boundary at or after the emulated done time
        ── scheduler.kv_received: the request computes its last prompt token, then decodes
        ── notify the peer: only now does prefill free its blocks (NIXL frees on the completion
           notification, so prefill holds the KV for the whole transfer); a request that ends before
           (aborted) notifies at once, and a failed pull has nothing to free
"""

from __future__ import annotations

import dataclasses

from actors.engine.kv_connectors.transfer import KVReceiver, TransferPlan
from actors.engine.request import Request, RequestStatus
from actors.engine.scheduling.scheduler import Scheduler
from messages import FinishedReason, KVTransferParams


class PDConnectorScheduler:
    def __init__(
        self,
        engine_id: str,
        *,
        receiver: KVReceiver,
        scheduler: Scheduler,
        hold_timeout_s: float,
        prefill_backoff: int = 0,
    ) -> None:
        """`receiver`: the emulated timing of transfers into this engine. `hold_timeout_s`: how long a
        finished request's KV waits for its pull (prefill: the decode engine's; decode, bidirectional:
        the conversation's next turn's). `prefill_backoff`: prompt tokens a prefill request leaves for
        decode to compute (vLLM's `_prefill_backoff`: 1 for a hybrid model, whose state decode continues
        from; else 0)."""
        self.prefill_backoff = prefill_backoff
        self.engine_id = engine_id
        self.receiver = receiver
        self.scheduler = scheduler
        self.hold_timeout_s = hold_timeout_s
        self._loaded: dict[str, Request] = {}
        """Decode side: requests whose KV is in this engine's blocks, not yet noticed by a step."""
        self._holding: set[str] = set()
        """Decode side: requests whose KV a prefill engine still holds for them (not notified yet)."""

    # ---- decode side -------------------------------------------------------------------------------

    def start_load(self, req: Request, now: float) -> TransferPlan | None:
        """`req` got its blocks at `now`: when its KV moves, in emulated time (stamped on its times);
        None for a push whose prefill has not finished yet (`push_ready` plans it then)."""
        assert req.kv_transfer_params is not None
        req.times.handoff.kv_blocks_ready_s = now
        self._holding.add(req.request_id)
        if req.kv_transfer_params.kv_push and req.kv_transfer_params.kv_sent_s is None:
            return None
        return self._plan(req)

    def push_ready(self, req: Request, kv_transfer_params: KVTransferParams) -> TransferPlan | None:
        """Push: prefill finished `req` (`kv_transfer_params` from it: where the KV is, in place of
        what decode had; decode keeps its `kv_push`); its plan if `req` has its blocks, else None
        (`start_load` plans it when they come)."""
        assert req.kv_transfer_params is not None
        req.kv_transfer_params = dataclasses.replace(
            kv_transfer_params,
            kv_push=req.kv_transfer_params.kv_push,
            prompt_token_ids=None,  # decode has the prompt already
        )
        blocks_ready = req.times.handoff.kv_blocks_ready_s is not None
        if not blocks_ready or req.status is not RequestStatus.WAITING_FOR_REMOTE_KVS:
            return None
        return self._plan(req)

    def _plan(self, req: Request) -> TransferPlan:
        handoff = req.times.handoff
        assert req.kv_transfer_params is not None and handoff.kv_blocks_ready_s is not None
        bs = self.scheduler.blocks.block_size
        first_block = req.times.num_cached_tokens // bs
        params = req.kv_transfer_params
        if req.is_pull_back:  # only the blocks it takes, none it holds already
            end = max(first_block, req.pull_back_tokens // bs)
            assert params.remote_block_ids is not None
            params = dataclasses.replace(params, remote_block_ids=params.remote_block_ids[:end])
        plan = self.receiver.plan(params, handoff.kv_blocks_ready_s, first_block)
        handoff.kv_transfer_start_s = plan.start_s
        handoff.kv_bytes = plan.kv_bytes
        handoff.state_bytes = plan.state_bytes
        return plan

    def on_load_failed(self, req: Request) -> bool:
        """The load failed: the prefill side holds nothing for `req` (it died, lost the KV, or was told
        to free it). Whether `req` computes those tokens here instead: a pull back always does, a P/D
        request by kv_transfer.load_failure_policy (else it fails)."""
        self._holding.discard(req.request_id)
        recompute = req.is_pull_back or self.receiver.cfg.load_failure_policy == "recompute"
        return recompute and req.status is RequestStatus.WAITING_FOR_REMOTE_KVS

    def recompute_instead(self, req: Request) -> None:
        """A load failed: `req` computes the tokens it meant to take (recorded on its times)."""
        handoff = req.times.handoff
        if req.is_pull_back:
            handoff.kv_pull_back_failed = True
        else:
            handoff.kv_load_failed = True
        handoff.kv_bytes = handoff.state_bytes = 0
        if not self.scheduler.blocks.keeps_hit_without_load:  # (a hybrid's hit had no state of its own)
            req.times.num_cached_tokens = 0
        self.scheduler.kv_received(req)

    def on_loaded(self, req: Request) -> None:
        self._loaded[req.request_id] = req

    def notice_loaded(self, now: float) -> list[Request]:
        """Step boundary: requests whose transfer is done by `now` (to join the scheduler's queue; their
        prefill engines are to be notified)."""
        noticed = []
        for rid in sorted(self._loaded):
            req = self._loaded[rid]
            if (req.times.handoff.kv_transfer_done_s or 0.0) <= now + 1e-12:
                del self._loaded[rid]
                req.times.handoff.kv_noticed_s = now
                self._holding.discard(rid)
                noticed.append(req)
        return noticed

    # ---- prefill side ------------------------------------------------------------------------------

    def on_new_request(self, req: Request) -> None:
        """A prefill request of a hybrid model computes its prompt but the last token (vLLM's N-1
        prefill): its SSM state as of token N-1 is what decode needs to compute token N itself, as it
        does for every model; a state as of N, which includes token N, would take it in twice."""
        n = self.prefill_backoff
        if n and req.is_remote_decode and not req.is_remote_prefill and req.num_prompt_tokens > n:
            req.truncate_prompt(n)

    def request_finished(
        self, req: Request, reason: FinishedReason, now: float
    ) -> tuple[KVTransferParams | None, bool]:
        """What a finished request hands on: prefill side, the kv_transfer_params for decode (None:
        nothing to hand); decode side, whether its prefill engine still holds KV for it (to notify)."""
        self._loaded.pop(req.request_id, None)
        holding = req.request_id in self._holding
        self._holding.discard(req.request_id)
        if not req.holds_kv_after(reason):
            return None, holding
        if req.is_remote_prefill and not req.is_pull_back:  # decode, bidirectional: a finished turn
            return self._conversation_params(req), holding
        return KVTransferParams(
            do_remote_prefill=True,
            remote_engine_id=self.engine_id,
            remote_request_id=req.request_id,
            remote_block_ids=tuple(req.block_ids),
            # the list itself (the prompt as sent, where a hybrid's was truncated): prompts are never
            # changed, and an actor boundary copies it anyway
            prompt_token_ids=req.full_prompt_token_ids or req.prompt_token_ids,
            kv_sent_s=now,
            prefill_compute_s=req.compute_s,
        ), holding

    def _conversation_params(self, req: Request) -> KVTransferParams:
        """Decode side, bidirectional: where a finished turn's blocks are, for the conversation's next
        turn to pull back. Only the full blocks whose KV is computed (prompt and answer but its last
        token), with their chained hashes (so that prefill can verify them)."""
        num_full = req.num_computed_tokens // self.scheduler.blocks.block_size
        return KVTransferParams(
            remote_engine_id=self.engine_id,
            remote_request_id=req.request_id,
            remote_block_ids=tuple(req.block_ids[:num_full]),
            remote_block_hashes=tuple(self.scheduler.blocks.block_hashes(req, num_full)),
        )

    def _expires_s(self, req: Request) -> float:
        """When the held KV of `req` (a finished prefill request, or decode's finished turn of a
        conversation) is released unpulled."""
        assert req.times.finished_s is not None, "only finished requests hold KV"
        return req.times.finished_s + self.hold_timeout_s

    def expire_held(self, now: float) -> int:
        """Release KV that no decode engine pulled within the hold timeout (its decode died); how many."""
        expired = [rid for rid, req in self.scheduler.held.items() if self._expires_s(req) <= now]
        for rid in expired:
            self.scheduler.release_held(rid)
        return len(expired)

    def upcoming(self, since: float) -> list[float]:
        """Emulated times of the connector's own events after `since`: loads already moved (noticed only
        once the loop runs again, so one done exactly at `since` counts) and the next held KV to expire
        (every caller wants only the earliest)."""
        times = [
            done
            for req in self._loaded.values()
            if (done := req.times.handoff.kv_transfer_done_s) is not None and done >= since
        ]
        # (some expired by `since` are still held, until the next step: those are not to come)
        if later := [t for t in map(self._expires_s, self.scheduler.held.values()) if t > since]:
            times.append(min(later))
        return times
