"""A hybrid model's KV cache as vLLM's hybrid manager keeps it: the block size raised until a page holds a
state, blocks sized by KV cache groups, a running-state block a Mamba group for each request, states
cached only at a prompt's checkpoint (align mode), hits only where a state is cached, and prompt
chunks cut at block boundaries (vLLM's `_mamba_block_aligned_split`, its own worked cases)."""

from __future__ import annotations

import functools

import pytest

from actors.engine.kv_cache.coordinator import KVCacheCoordinator
from actors.engine.kv_cache.mamba_align import block_aligned_split
from actors.engine.kv_cache.mamba_state import MambaStateManager, MambaStates, MambaStateSpec
from actors.engine.request import Request
from cluster.config_load import ConfigError
from emulation.kv_cache import num_gpu_blocks
from emulation.profiles import GPUS, MODELS
from messages import EngineRequest
from tests.factories import make_config

NANO = MODELS["nemotron-3-nano-30b-a3b"]
BS = 16
G = 4  # Nemotron-3-Nano's Mamba groups


def req(tokens, rid="a", max_tokens=4):
    return Request(EngineRequest(rid, list(tokens), max_tokens), 0.0)


def states(bm: KVCacheCoordinator, r: Request) -> MambaStates:
    """What `r` holds of the SSM states (the coordinator's Mamba manager's record of it)."""
    (mamba,) = [m for m in bm.managers if isinstance(m, MambaStateManager)]
    return mamba.held(r)


def compute(bm: KVCacheCoordinator, r: Request, n: int | None = None) -> None:
    """Admit `r` with its prefix hit and compute `n` more tokens (all: its prompt) in one step."""
    if not r.block_ids:
        hits = bm.get_computed_blocks(r)
        r.num_computed_tokens = len(hits) * bm.block_size
    else:
        hits = []
    n = r.num_tokens - r.num_computed_tokens if n is None else n
    assert bm.allocate_slots(r, n, hits)
    r.num_computed_tokens += n
    bm.on_step_done([r])


def test_the_block_size_is_raised_unless_set_and_a_set_one_must_hold_the_state():
    """Unset, scheduler.block_size becomes vLLM's raised size for the pools (Nano at TP 2: 2,096; the
    largest when P and D differ: TP 1's 2,096 over TP 4's 16 · cdiv(533,504 + 9,216... ) = 1,056); set
    too small, one line naming the field, the value and what holds the state."""
    h100 = {"target": {"model": NANO.name}, "runner": {"compute": "skip"}}
    cfg = make_config(h100, pools={"mixed": {"replicas": 1, "gpu": "h100-sxm", "tp": 2}})
    assert cfg.scheduler.block_size == 2096
    pd = make_config(h100, pools={"mixed": {"replicas": 0}, "prefill": {"replicas": 1, "gpu": "h200"},
                                  "decode": {"replicas": 1, "gpu": "h100-sxm", "tp": 4}})  # fmt: skip
    assert NANO.page(4).block_size == 1056 and pd.scheduler.block_size == NANO.page(1).block_size == 2096
    tp2 = {"mixed": {"replicas": 1, "gpu": "h100-sxm", "tp": 2}}
    with pytest.raises(ConfigError, match=r"^scheduler\.block_size=1024: .* allowed: at least 2,084"):
        make_config(h100, pools=tp2, scheduler={"block_size": 1024})
    assert make_config(h100, pools=tp2, scheduler={"block_size": 4096}).scheduler.block_size == 4096


def test_blocks_are_counted_in_kv_cache_groups():
    """vLLM's num_blocks = memory // (group_size x page): Nano at TP 2 on H100s, 0.9 of 80 GB less each
    GPU's half of the weights, over 6 pages of 2,096 x 512 B (one attention and four Mamba groups)."""
    cfg = make_config({"target": {"model": NANO.name}, "runner": {"compute": "skip"}},
                      pools={"mixed": {"replicas": 1, "gpu": "h100-sxm", "tp": 2}})  # fmt: skip
    from emulation.expert_parallel import weight_bytes_per_gpu

    usable = GPUS["h100-sxm"].memory_gb * 1e9 * 0.9 - weight_bytes_per_gpu(NANO, cfg.pools.mixed)
    assert num_gpu_blocks(cfg, cfg.pools.mixed) == int(usable // (6 * 2096 * 512))
    assert NANO.kv_cache_groups.num_state_groups == G


def test_each_request_holds_a_state_block_in_each_mamba_group_and_gives_them_back():
    bm = KVCacheCoordinator(64, BS, False, specs=[MambaStateSpec(G, False, 8192)])
    a = req(range(40))
    compute(bm, a, 20)
    assert len(states(bm, a).block_ids) == G and len(a.block_ids) == 2 and bm.num_free_blocks == 64 - 2 - G
    compute(bm, a)  # the rest of the prompt: no new state block
    assert len(states(bm, a).block_ids) == G and bm.num_free_blocks == 64 - 3 - G
    bm.free(a)
    bm.assert_empty()
    b = req(range(40), "b")
    assert not bm.allocate_slots(b, 61 * 16)  # 61 KV blocks fit, not with 4 state blocks: nothing taken
    assert not states(bm, b).block_ids and bm.num_free_blocks == 64


def test_a_state_is_cached_only_at_a_prompts_checkpoint_and_hits_end_there():
    """Prompt A of 72 tokens (block 16): its checkpoint is floor(71 / 16) · 16 = 64. B repeating A
    hits 4 blocks (64 tokens, the state there); C sharing A's first 40 tokens hits attention blocks
    0-1 but no state at 32: no hit (vLLM keeps one boundary a prompt); D of 16 tokens: no hit below
    one block, even repeated."""
    bm = KVCacheCoordinator(64, BS, True, specs=[MambaStateSpec(G, False, 8192)])
    a = req(range(72), "a")
    compute(bm, a)
    assert states(bm, a).checkpoint is None and len(bm.pool.state_cache) == 1
    bm.free(a)
    b = req(range(72), "b")
    assert len(bm.get_computed_blocks(b)) == 4
    compute(bm, b)
    c = req([*range(40), *range(1000, 1040)], "c")
    assert bm.pool.prefix_index.find(c) and bm.get_computed_blocks(c) == []
    for rid in ("d1", "d2"):
        d = req(range(500, 516), rid)
        compute(bm, d)
        assert d.times.num_cached_tokens == 0 and bm.get_computed_blocks(req(range(500, 516), "x")) == []
        bm.free(d)
    bm.free(b)
    bm.assert_empty()


def test_a_hit_holds_the_cached_state_until_its_first_step_and_eviction_forgets_it():
    bm = KVCacheCoordinator(16, BS, True, specs=[MambaStateSpec(G, False, 8192)])
    a = req(range(40), "a")  # checkpoint at 32
    compute(bm, a)
    bm.free(a)
    b = req(range(40), "b")
    hits = bm.get_computed_blocks(b)
    b.num_computed_tokens = 32
    assert bm.allocate_slots(b, 8, hits)
    hold = states(bm, b).hold
    assert len(hold) == G and all(block in bm.pool.ref_cnt for block in hold)
    bm.on_step_done([b])
    assert not states(bm, b).hold
    bm.free(b)
    bm.assert_empty()
    big = req(range(2000, 2200), "big")  # 12 KV and 4 state blocks: all 16, the cached state's too
    compute(bm, big, 190)
    assert len(bm.pool.state_cache) == 0 and bm.get_computed_blocks(req(range(40), "c")) == []
    bm.free(big)
    bm.assert_empty()


@pytest.mark.parametrize(
    ("num_tokens", "budget", "internal", "chunks"),
    [
        (3000, 8192, False, [2176, 824]),  # gated delta net (no export): stops at the checkpoint 2,176
        (3000, 8192, True, [3000]),  # Mamba2 exports the checkpoint from inside the step
        (20000, 8192, True, [7616, 7616, 4768]),  # 7,616 = 7 x 1,088: rounded down, the last exempt
        (20000, 8192, False, [7616, 7616, 4352, 416]),
        (2000, 512, True, [512, 512, 64, 512, 400]),  # a budget under a block: sub-block, re-aligned at 1,088
    ],
)
def test_prompt_chunks_follow_vllms_block_aligned_split(num_tokens, budget, internal, chunks):
    """vLLM's own worked cases at block_size 1,088 (the N = 20,000 and budget 8,192 ones from its
    scheduler's rule; the budget-512 case by hand: 512, 512, then 64 to reach the boundary 1,088)."""
    r = req(range(num_tokens), max_tokens=1)
    got = []
    while r.num_computed_tokens < num_tokens:
        n = block_aligned_split(
            r, min(budget, num_tokens - r.num_computed_tokens), block_size=1088, max_prefill_tokens=budget,
            internal_checkpoint=internal,
        )  # fmt: skip
        assert n > 0
        got.append(n)
        r.num_computed_tokens += n
    assert got == chunks


def test_a_chunk_that_cannot_reach_a_boundary_waits():
    """Budget left 1,000 under a 1,088 block that the budget limit could fill: 0 tokens (vLLM: a new
    request stops admission, a running one waits a step); decodes are never cut."""
    r = req(range(5000))
    split = functools.partial(
        block_aligned_split, block_size=1088, max_prefill_tokens=8192, internal_checkpoint=True
    )
    assert split(r, 1000) == 0
    r.num_computed_tokens = 5000
    r.output_token_ids.append(1)
    assert split(r, 1) == 1
