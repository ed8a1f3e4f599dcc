"""One scheduler for every role (vLLM v1 semantics): computed tokens catch up with known tokens.

Each step shares `max_num_batched_tokens` among, in order:
  1. running requests, in the order they started running (decodes and partial prefills alike: a
     decode behind a prompt chunk gets what the chunk leaves, as in vLLM's v1 scheduler),
  2. waiting requests, oldest first, up to `max_num_seqs` running, after a prefix-cache lookup.
When blocks run out for a running request, the newest running request is preempted (its blocks freed,
to be recomputed from scratch). Roles differ only at the edges: a prefill request (`do_remote_decode`)
keeps its blocks after finishing until the decode side has pulled them; a decode request
(`do_remote_prefill`) gets blocks for its whole prompt and waits for the remote KV before joining.
"""

from __future__ import annotations

import functools
import operator
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from actors.engine.kv_cache.coordinator import KVCacheCoordinator
from actors.engine.request import Request, RequestStatus
from actors.engine.scheduling.encoder_cache import EncoderCache
from actors.engine.scheduling.scheduled_batch import ScheduledBatch
from messages import FinishedReason


class KVLookup(Protocol):
    """A source of KV after a fresh request's GPU prefix hit (an offloading connector's tiers)."""

    def lookup(self, req: Request, num_hit_blocks: int, now: float) -> int:
        """Blocks after a GPU hit of `num_hit_blocks` that it holds ready at `now` (its load planned)."""
        ...


class PullBackRule:
    """Bidirectional: how many leading tokens of decode's sequence a pull back takes: full blocks, never
    the prompt's last token (computed here, for the first output token's logits). `verified`: as far as
    the chained block hashes agree with this prompt's; `positional`: as far as decode's sequence
    reaches, whatever its tokens (the bug vLLM issue #43094 describes, kept to reproduce it)."""

    def __init__(self, blocks: KVCacheCoordinator, reuse: str = "verified") -> None:
        self.blocks = blocks
        self.reuse = reuse

    def num_tokens(self, req: Request) -> int:
        params = req.kv_transfer_params
        assert params is not None
        bs = self.blocks.block_size
        limit = (req.num_prompt_tokens - 1) // bs
        theirs = params.remote_block_hashes
        assert theirs is not None
        if self.reuse == "positional":
            return min(len(theirs), limit) * bs
        num = 0
        for own, other in zip(self.blocks.block_hashes(req, limit), theirs, strict=False):
            if own != other:
                break
            num += 1
        return num * bs


class ExternalKV:
    """Blocks for a waiting request's KV that comes from outside this engine's GPU prefix cache: a
    peer's (decode's prompt from prefill, a pull back of decode's blocks: `pull_back`) or the engine's
    offload tiers' (`offload`, in lookup order)."""

    def __init__(
        self, blocks: KVCacheCoordinator, pull_back: PullBackRule, offload: Sequence[KVLookup]
    ) -> None:
        self.blocks = blocks
        self.pull_back = pull_back
        self.offload = offload

    def offload_hit(self, req: Request, hits: list[int], now: float) -> int:
        """The prompt tokens after the GPU hit `hits` of a fresh request that the engine's offload tiers
        supply (KV offloading; 0 without, and for a request whose KV comes from a peer)."""
        if req.is_remote_prefill:
            return 0
        for source in self.offload:
            if num_blocks := source.lookup(req, len(hits), now):
                return num_blocks * self.blocks.block_size
        return 0

    def allocate_for_remote_kv(self, req: Request) -> bool:
        """Blocks for the whole prompt, the leading ones from this engine's own prefix cache (they need
        not move); False (nothing held) if they do not fit. A pull back learns here how much of
        decode's sequence it takes (`PullBackRule`)."""
        hits = self.blocks.get_computed_blocks(req)
        req.num_computed_tokens = len(hits) * self.blocks.block_size
        if req.is_pull_back:
            req.pull_back_tokens = self.pull_back.num_tokens(req)
        # All but its last prompt token arrive; that one is computed here (its slot taken now).
        if self.allocate_for_load(req, hits, req.num_prompt_tokens - req.num_computed_tokens - 1, 1):
            return True
        req.num_computed_tokens = 0
        return False

    def allocate_for_load(
        self,
        req: Request,
        hits: list[int],
        num_external_tokens: int,
        num_new_tokens: int = 0,
        must_fit: bool = False,
    ) -> bool:
        """Blocks for `req`'s prefix hit `hits`, `num_external_tokens` more whose KV comes from
        elsewhere (cached once it has come; the budget is not spent on them, as vLLM allocates for
        external tokens) and `num_new_tokens` to compute after them; False (nothing held, nothing
        changed) if they do not fit (`must_fit`: the whole prompt must)."""
        if not self.blocks.allocate_slots(
            req,
            num_new_tokens,
            hits,
            num_external_computed_tokens=num_external_tokens,
            full_sequence_must_fit=must_fit,
            delay_cache_blocks=True,
        ):
            return False
        self.blocks.record_prefix_cache_stats(req, req.num_computed_tokens)
        if req.times.first_scheduled_s is None:  # (a preempted request loading again keeps its first)
            req.times.num_cached_tokens = req.num_computed_tokens
        return True


class HeldKV(dict[str, Request]):
    """Finished requests whose blocks outlive them for a pull, by request id: prefill's for decode (a
    promise, kept until decode's notice or the hold timeout) and, bidirectional, decode's turns for the
    conversation's next turn (a cache: when blocks run short the oldest gives way before a request
    waits or one running is preempted, `release_oldest_turn`; its pull back then computes instead)."""

    def __init__(self, blocks: KVCacheCoordinator) -> None:
        super().__init__()
        self.blocks = blocks
        self._turns: dict[str, None] = {}
        """The conversation turns held, oldest first."""

    def hold(self, req: Request) -> None:
        self[req.request_id] = req
        if req.is_conversation_turn:
            self._turns[req.request_id] = None

    def release(self, request_id: str) -> Request | None:
        """Free the blocks held for `request_id`; the request (None: none held)."""
        req = self.pop(request_id, None)
        self._turns.pop(request_id, None)
        if req is not None:
            self.blocks.free(req)
        return req

    def release_oldest_turn(self) -> bool:
        """Free the blocks of the oldest conversation turn held (False: none is)."""
        if not self._turns:
            return False
        self.release(next(iter(self._turns)))
        return True


class Scheduler:
    def __init__(
        self,
        blocks: KVCacheCoordinator,
        *,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        max_num_batched_encoder_embeds: int | None = None,
        encoder_cache: EncoderCache | None = None,
        reserve_full_isl: bool = True,
        long_prefill_token_threshold: int = 0,
        pull_back_reuse: str = "verified",
        offload: Sequence[KVLookup] = (),
    ) -> None:
        """`reserve_full_isl`: admit a waiting request only if its whole sequence fits in the free
        blocks (vLLM's default), not just its first chunk; `long_prefill_token_threshold`: the most
        tokens one request computes in a step (vLLM's; 0: the budget); `pull_back_reuse`: which of decode's
        blocks a pull back takes (`PullBackRule`); `offload`: the engine's offload tiers' lookups."""
        self.blocks = blocks
        self.reserve_full_isl = reserve_full_isl
        self.max_num_new_tokens = long_prefill_token_threshold or max_num_batched_tokens
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_encoder_embeds = max_num_batched_encoder_embeds or max_num_batched_tokens
        self.encoder_cache = encoder_cache or EncoderCache(self.max_num_batched_encoder_embeds)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.recving: dict[str, Request] = {}
        """Decode side: requests whose blocks are allocated and whose remote KV is in flight."""
        self.held = HeldKV(blocks)
        self.external = ExternalKV(blocks, PullBackRule(blocks, pull_back_reuse), offload)
        """Admitting requests whose KV comes from outside this engine's GPU cache."""
        self.num_preemptions = 0

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.recving)

    def has_schedulable_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, req: Request) -> None:
        """Queue `req` in order of its arrival (`queued_s`): a request sent ahead of its arrival time
        may reach the engine after one that arrives earlier, and each is seen only from its arrival."""
        i = len(self.waiting)
        while i > 0 and self.waiting[i - 1].times.queued_s > req.times.queued_s:
            i -= 1
        self.waiting.insert(i, req)

    def schedule(self, now: float) -> ScheduledBatch:
        """The next step's batch; requests queued after `now` (emulated) are not seen yet."""
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        preempted = False
        for req in list(self.running):
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:  # preempted earlier in this loop
                continue
            num_encoding = len(batch.encoder_inputs)
            n = self._cut(req, self.num_new_tokens(req.num_tokens - req.num_computed_tokens, budget), batch)
            if n == 0:
                continue
            while not self.blocks.allocate_slots(req, n):
                if self.held.release_oldest_turn():
                    continue
                victim = next((r for r in reversed(self.running) if r not in batch.requests), req)
                self._preempt(victim)
                batch.preempted.append(victim)
                preempted = True
                if victim is req:
                    break
            if req.status is RequestStatus.RUNNING:
                batch.add(req, n)
                budget -= n
            else:  # preempted: it computes nothing this step
                batch.drop_images(num_encoding)
        if not preempted:
            budget = self._schedule_waiting(batch, budget, now)
        return batch

    def _schedule_waiting(self, batch: ScheduledBatch, budget: int, now: float) -> int:
        while self.waiting and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if req.times.queued_s > now:
                break
            if self.takes_blocks_first(req):
                if not self._allocate(self.external.allocate_for_remote_kv, req):
                    break
                if req.num_external_computed_tokens > 0:
                    self._wait_for_kv(req, batch.new_remote_requests)
                    continue
                # A pull back that takes nothing this engine lacks (verified reuse stopped inside its
                # own prefix cache): no transfer, as vLLM's connector matching no external tokens
                # loads none; it runs as a local request on the blocks it holds.
                req.remote_kv_loaded = True
                batch.pull_backs_taking_nothing.append(req)
            if budget == 0:
                break
            fresh = not req.block_ids  # new or preempted (a pulled 1-token prompt has blocks, no tokens)
            hits = self.blocks.get_computed_blocks(req) if fresh else []
            if fresh:
                req.num_computed_tokens = len(hits) * self.blocks.block_size
                if num_loaded := self.external.offload_hit(req, hits, now):  # its tiers hold more of it
                    must_fit = self.reserve_full_isl
                    if not self._allocate(
                        self.external.allocate_for_load, req, hits, num_loaded, 0, must_fit
                    ):
                        req.num_computed_tokens = 0
                        break
                    self._wait_for_kv(req, batch.new_offload_loads)
                    continue
            num_encoding = len(batch.encoder_inputs)
            n = self._cut(req, self.num_new_tokens(req.num_tokens - req.num_computed_tokens, budget), batch)
            must_fit = self.reserve_full_isl
            allocate = self.blocks.allocate_slots
            if n == 0 or not self._allocate(allocate, req, n, hits, full_sequence_must_fit=must_fit):
                batch.drop_images(num_encoding)
                if fresh:
                    req.num_computed_tokens = 0
                break
            if fresh:
                self.blocks.record_prefix_cache_stats(req, req.num_computed_tokens)
            self.waiting.popleft()
            if fresh and req.times.first_scheduled_s is None:
                req.times.num_cached_tokens = req.num_computed_tokens
            req.times.scheduled_s = now
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            batch.add(req, n)
            budget -= n
        return budget

    def num_new_tokens(self, num_left: int, budget: int) -> int:
        """The tokens a request with `num_left` tokens to compute is given of the step's `budget` left
        (before a kind of KV or an image cuts them: `_cut`)."""
        return min(num_left, budget, self.max_num_new_tokens)

    def _allocate(self, allocate: Callable[..., bool], *args: Any, **kwargs: Any) -> bool:
        """`allocate(*args, **kwargs)`, tried again after each turn kept for a pull back is released,
        while it fails."""
        while not allocate(*args, **kwargs):
            if not self.held.release_oldest_turn():
                return False
        return True

    def head_of_line(self, now: float) -> Request | None:
        """The first waiting request, if it is visible at `now` (the one the next schedule looks at)."""
        return self.waiting[0] if self.waiting and self.waiting[0].times.queued_s <= now else None

    @staticmethod
    def takes_blocks_first(req: Request) -> bool:
        """A waiting request that gets blocks before the token budget is looked at: a remote prefill
        whose KV has not moved (its blocks are allocated for the pull, budget or not)."""
        return req.is_remote_prefill and not req.remote_kv_loaded and req.status is RequestStatus.WAITING

    def _cut(self, req: Request, n: int, batch: ScheduledBatch) -> int:
        """`n`, or fewer where a kind of KV cuts the chunk (a hybrid's block boundaries) or an image it
        reaches cannot be encoded this step (the images to encode join the batch)."""
        n = self.blocks.align_chunk(req, n)
        if not n or not req.mm_items:
            return n
        return batch.add_images(req, n, self.encoder_cache, self.max_num_batched_encoder_embeds)

    def _wait_for_kv(self, req: Request, loads: list[Request]) -> None:
        """`req`, holding blocks for KV from elsewhere, leaves the queue to wait for it (`loads`: the
        batch's list of loads to start)."""
        self.waiting.popleft()
        req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        self.recving[req.request_id] = req
        loads.append(req)

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.blocks.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        req.times.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def update_from_output(
        self, batch: ScheduledBatch, sampled: list[int | None], start_s: float, step_s: float
    ) -> list[tuple[Request, int, FinishedReason | None]]:
        """Advance each request of the step that began at `start_s` (and took `step_s`) by the tokens
        it computed; the requests that reached their end emit a token (the forced answer's, or
        `sampled`): returns each with its token and the reason it now stops (None: it goes on)."""
        emitted, computed = [], []
        for req, n, token in zip(batch.requests, batch.num_new_tokens, sampled, strict=True):
            if req.status is not RequestStatus.RUNNING:  # aborted while the step ran
                continue
            if req.times.first_scheduled_s is None:
                req.times.first_scheduled_s = start_s
            req.num_computed_tokens += n
            req.compute_s += step_s
            computed.append(req)
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk short of the end: no token yet
            forced = req.forced_output_token_ids
            if forced is not None:
                token = forced[len(req.output_token_ids)]
            assert token is not None, "greedy output needs real compute"
            req.output_token_ids.append(token)
            emitted.append((req, token, stop_reason(req, token)))
        self.blocks.on_step_done(computed)
        return emitted

    def steady(self, batch: ScheduledBatch, now: float) -> bool:
        """Whether the next schedules repeat `batch` until a request in it ends, but for one more token
        each (a window of steps): every running request is in it, each decoding one token but the last,
        which may compute a prompt chunk, all with forced answers (compute skip); nothing else happens
        this step, and no waiting request is visible yet, or (beside a prompt chunk) one only the token
        budget holds back."""
        if (
            batch.preempted
            or batch.new_remote_requests
            or batch.new_offload_loads
            or batch.pull_backs_taking_nothing
        ):
            return False
        if batch.encoder_inputs or len(batch.requests) != len(self.running):
            return False
        *decodes, last = batch.num_new_tokens
        head = self.head_of_line(now)
        if head is not None and (last == 1 or self.takes_blocks_first(head)):
            return False
        if any(n != 1 for n in decodes):
            return False
        if last == 1 and batch.shape.num_logits != batch.shape.num_new_tokens:
            return False
        if last > 1 and batch.requests[-1].mm_items:  # its chunks would stop at images to encode
            return False
        if not self.blocks.steady(batch.requests, chunked=last > 1):
            return False  # a kind of KV changes its blocks otherwise (a hybrid's aligned chunks, states)
        return all(r.forced_output_token_ids is not None for r in batch.requests)

    def prompt_chunks(self, req: Request, budget: int) -> list[int]:
        """The chunks the next steps give `req` of `budget` each until its prompt is computed (a
        `steady` batch's last request, beside decodes that leave it `budget`); its last token is not
        one (with one token left it is scheduled as a decode)."""
        chunks: list[int] = []
        num_left = req.num_tokens - req.num_computed_tokens
        while num_left > 0 and not (chunks and num_left == 1):
            chunks.append(self.num_new_tokens(num_left, budget))
            num_left -= chunks[-1]
        return chunks

    def update_from_steps(
        self,
        batch: ScheduledBatch,
        chunks: list[int],
        start_s: float,
        steps_s: list[float],
        ends_s: list[float],
    ) -> list[tuple[Request, list[int], list[float], FinishedReason | None]]:
        """`update_from_output` for the next `len(steps_s)` steps of a `steady` batch at once (a window),
        the first begun at `start_s`, each taking `steps_s` and ending at `ends_s`: blocks
        (`allocate_steps`), computed tokens, compute time, tokens out; each request with its new tokens,
        their stamps and the reason it now stops (None: it goes on). `chunks`: the last request's
        prompt chunk each step (none: decodes)."""
        k, requests = len(steps_s), batch.requests
        self.blocks.allocate_steps(requests, chunks, k)
        out = []
        for i, req in enumerate(requests):
            assert req.status is RequestStatus.RUNNING, "a window's requests run to its end"
            if req.times.first_scheduled_s is None:
                req.times.first_scheduled_s = start_s
            chunked = bool(chunks) and i == len(requests) - 1
            req.num_computed_tokens += sum(chunks[:k]) if chunked else k
            req.compute_s = functools.reduce(operator.add, steps_s, req.compute_s)  # as one at a time
            forced = req.forced_output_token_ids
            assert forced is not None
            n = len(req.output_token_ids)
            num_out = (1 if req.num_computed_tokens >= req.num_tokens else 0) if chunked else k
            tokens = list(forced[n : n + num_out])
            req.output_token_ids += tokens
            self.blocks.cache_blocks(req, req.num_computed_tokens)
            if tokens:
                out.append((req, tokens, ends_s[k - len(tokens) :], stop_reason(req, tokens[-1])))
        return out

    def kv_received(self, req: Request) -> None:
        """The remote prompt KV is in this engine's blocks: all but the last prompt token are computed.

        The last one is recomputed here, which yields the logits for the first output token.
        """
        del self.recving[req.request_id]
        req.remote_kv_loaded = True
        if req.is_remote_prefill:
            req.times.num_external_tokens = req.num_external_computed_tokens
            req.num_computed_tokens = req.times.num_cached_tokens + req.num_external_computed_tokens
        else:  # loaded from the offload tiers: its GPU hit, then those blocks
            req.num_computed_tokens += req.num_offload_tokens
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)

    def finish(self, req: Request, reason: FinishedReason) -> None:
        """End `req`: free its blocks, or hold them for a decode engine's pull."""
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status is RequestStatus.WAITING_FOR_REMOTE_KVS:
            del self.recving[req.request_id]
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = RequestStatus.FINISHED
        req.finished_reason = reason
        if req.holds_kv_after(reason):
            self.held.hold(req)
        else:
            self.blocks.free(req)

    def release_held(self, request_id: str) -> Request | None:
        return self.held.release(request_id)

    def assert_empty(self) -> None:
        assert not self.waiting, f"waiting: {[r.request_id for r in self.waiting]}"
        assert not self.running, f"running: {[r.request_id for r in self.running]}"
        assert not self.recving, f"waiting for remote KV: {list(self.recving)}"
        assert not self.held, f"held for pickup: {list(self.held)}"
        self.blocks.assert_empty()


def stop_reason(req: Request, token: int) -> FinishedReason | None:
    """Why `req` stops now that `token` is its last output token (None: it goes on)."""
    forced, num_output = req.forced_output_token_ids, len(req.output_token_ids)
    if forced is None and token in req.stop_token_ids:
        return "stop"
    if num_output >= req.max_tokens:
        return "length"
    if forced is not None and num_output >= len(forced):
        return "stop"  # the forced answer is complete
    return None
