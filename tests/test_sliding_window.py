"""Sliding-window layers' KV (gpt-oss): blocks leave the window and are freed, the pool is sized in KV
cache groups, and a prefix hit ends where a prompt's window was cached (vLLM's default retention).

Freeing and counting are checked against vLLM itself in `test_vllm_sliding_window.py` (caching off);
the rules with prefix caching on are checked here, from vLLM 0.32's `SlidingWindowManager`
(`find_longest_cache_hit`, `reachable_block_mask` with `prefix_cache_retention_interval` 0).
"""

from __future__ import annotations

from actors.engine.kv_cache.coordinator import KVCacheCoordinator
from actors.engine.kv_cache.sliding_window import SlidingWindowManager, SlidingWindowSpec
from actors.engine.request import Request
from emulation.kv_cache import kv_capacity_tokens, num_gpu_blocks
from emulation.profiles import GPUS, MODELS
from messages import EngineRequest
from tests.factories import make_config

BS, W = 16, 40  # a hit needs cdiv(39, 16) = 3 contiguous window blocks


def req(tokens, rid="a", max_tokens=4):
    return Request(EngineRequest(rid, list(tokens), max_tokens), 0.0)


def coordinator(
    num_blocks: int = 64, caching: bool = True
) -> tuple[KVCacheCoordinator, SlidingWindowManager]:
    kv = KVCacheCoordinator(num_blocks, BS, caching, specs=[SlidingWindowSpec(W, 1, 64)])
    return kv, next(m for m in kv.managers if isinstance(m, SlidingWindowManager))


def run(kv: KVCacheCoordinator, r: Request, chunk: int = 64) -> None:
    """Admit `r` with its prefix hit and compute its prompt in chunks, then its outputs one a step."""
    hits = kv.get_computed_blocks(r)
    r.num_computed_tokens = len(hits) * BS
    first = True
    while r.num_computed_tokens < r.num_tokens:
        n = min(chunk, r.num_tokens - r.num_computed_tokens)
        assert kv.allocate_slots(r, n, hits if first else None, full_sequence_must_fit=first)
        first = False
        r.num_computed_tokens += n


def test_blocks_that_leave_the_window_are_freed_and_the_rest_when_it_ends():
    kv, sliding = coordinator(caching=False)
    a = req(range(200))
    run(kv, a)  # chunks end at 64, 128, 192, 200: the last allocate frees what 192 tokens leave behind
    skipped = (192 - W + 1) // BS  # 9 blocks before the window of token 192
    assert [slot is None for slot in sliding.tables(a)] == [True] * skipped + [False] * (13 - skipped)
    assert kv.num_free_blocks == 64 - 13 - (13 - skipped)  # full attention keeps all 13
    kv.free(a)
    kv.assert_empty()


def test_a_repeat_hits_at_its_replay_boundary_and_holds_the_cached_window():
    kv, sliding = coordinator()
    a = req(range(100))  # replay boundaries at 96 (resend) and 96 (floor(100/16)*16): window blocks 3..5
    run(kv, a)
    kv.free(a)
    b = req(range(100), "b")
    assert len(kv.get_computed_blocks(b)) == 6  # 96 tokens: the window blocks 3, 4, 5 are cached
    run(kv, b)
    assert [slot is None for slot in sliding.tables(b)][:6] == [True] * 3 + [False] * 3
    kv.free(b)
    kv.assert_empty()


def test_a_longer_prompt_hits_only_where_a_window_was_cached():
    kv, _ = coordinator()
    a = req(range(100))
    run(kv, a)
    kv.free(a)
    # Full attention holds 5 blocks of a prompt sharing 80 tokens, but the sliding group cached only
    # the window ending at 96 (blocks 3 to 5): no 3 contiguous ones end within the 5, and block 0 is
    # not cached, so nothing hits.
    b = req([*range(80), *range(1000, 1100)], "b")
    assert kv.attention.find_longest_cache_hit(b) and len(kv.get_computed_blocks(b)) == 0
    c = req([*range(96), *range(1000, 1100)], "c")  # a longer sibling: its hit ends at 96
    assert len(kv.get_computed_blocks(c)) == 6


def test_without_the_window_cached_a_short_prefix_hits_from_the_start():
    """A hit shorter than the window needs a run of cached window blocks from the first block."""
    kv, _ = coordinator()
    a = req(range(20))  # boundaries at 16: window blocks max(0, 1-3)..0 = block 0
    run(kv, a)
    kv.free(a)
    assert len(kv.get_computed_blocks(req(range(40), "b"))) == 1


def test_gpt_oss_blocks_hold_one_group_of_layers_so_the_pool_doubles():
    """gpt-oss-120b: 18 full and 18 sliding layers, one KV cache group each; a block is a page in 18
    layers (vLLM's hybrid KV cache manager), not in all 36: twice the blocks, and a request holds its
    full-attention blocks and its window's."""
    model = MODELS["gpt-oss-120b"]
    groups = model.kv_cache_groups
    assert (groups.group_size, groups.num_attention_groups, groups.num_sliding_groups) == (18, 1, 1)
    cfg = make_config(
        target={"model": "gpt-oss-120b"}, pools={"mixed": {"replicas": 1, "gpu": "h200", "tp": 1}}
    )
    pool = cfg.pools.mixed
    all_layers = kv_capacity_tokens(model, GPUS[pool.gpu], pool, cfg.target.gpu_memory_utilization) // BS
    assert abs(num_gpu_blocks(cfg, pool) - 2 * all_layers) <= 2


def test_a_handoff_moves_the_sliding_layers_kv_for_the_window_only():
    """vLLM's NIXL connector clips a sliding-window group's blocks to its last cdiv(W, bs) + 1
    (`blocks_per_sw`): gpt-oss (18 full and 18 sliding layers, W = 128) moves its full layers' KV for
    the whole prompt and its sliding layers' for 9 blocks of 16; a dense model all of it."""
    from actors.engine.kv_connectors.transfer import KVReceiver
    from emulation.profiles import LINKS
    from emulation.transfer import handoff_time
    from messages import KVTransferParams
    from tests.factories import PD

    cfg, link = make_config(PD), LINKS["rdma-400g"]
    params = KVTransferParams(remote_block_ids=tuple(range(512)), remote_engine_id="prefill-0")
    gpt_oss = MODELS["gpt-oss-120b"]
    plan = KVReceiver(cfg.kv_transfer, link=link, model=gpt_oss, block_size=16).plan(params, 0.0)
    per_layer = gpt_oss.kv_bytes_per_token // 36
    assert plan.kv_bytes == 16 * per_layer * 18 * (512 + 9)
    assert plan.time == handoff_time(plan.kv_bytes, 512 + 9, link, 1)
    short = KVTransferParams(remote_block_ids=(0, 1, 2), remote_engine_id="prefill-0")  # inside the window
    plan = KVReceiver(cfg.kv_transfer, link=link, model=gpt_oss, block_size=16).plan(short, 0.0)
    assert plan.kv_bytes == 3 * 16 * gpt_oss.kv_bytes_per_token
    dense = MODELS["qwen2.5-7b"]
    plan = KVReceiver(cfg.kv_transfer, link=link, model=dense, block_size=16).plan(params, 0.0)
    assert plan.kv_bytes == 512 * 16 * dense.kv_bytes_per_token
