"""The testbed's step-time model as Dynamo's mocker profile table, the engine arguments that mirror a
testbed design, and what the table prices differently from the testbed (for bench/dynamo_replay.py).

The table (a NumPy NPZ, float64, milliseconds), as ai-dynamo 1.6.1 reads it: `dynamo/mocker/utils/
planner_profiler_perf_data_converter.py` (`is_mocker_format_npz`, `convert_profile_results_to_npz`)
names the five keys and their shapes, and the mocker's `PerfModel::from_npz` (lib/mocker/src/common/
perf_model.rs in Dynamo's repository; its error strings, "Failed to load prefill_isl from NPZ" and the
others, are in the 1.6.1 `_core.abi3.so`) loads them as f64 arrays::

    prefill_isl              (P,)    prompt tokens of a prefill pass
    prefill_ttft_ms          (P,)    its time; linear interpolation, extrapolated past the ends
    decode_active_kv_tokens  (K,)    KV tokens the pass's decodes attend to
    decode_context_length    (C,)    their mean context (tokens)
    decode_itl               (K, C)  the decode pass's time; bilinear, extrapolated

A pass's prefill is looked up at `batch_size * (isl - prefix)` (the new prompt tokens of all its
chunks together: context and cached prefix are not priced); a vLLM pass costs its prefill lookup plus
its decode lookup (aisimulate-core's `scheduler/vllm/core.rs`: `predict_prefill_duration`, then
`emit_ready_tokens` from the prefill's end). Probed on the installed 1.6.1 with tables that return their
own coordinates (one 1,000-token prompt, 4 output tokens; then two such prompts at once): a first token
is stamped at the end of the pass's prefill part (TTFT = the prefill lookup); the decode lookup's
active KV is the sum of the decoding requests' sequence lengths, prompt and output so far, a shared
prefix counted once per request (1,001, 1,002, 1,003; two requests: 2,002 ...), not block-rounded, and
its context their mean. Each entry here is the testbed's own step time of that pass alone,
`time_model_for(cfg, pool).step_time_of(StepShape)`:

- prefill: one prompt of n tokens at no context, its logits (n on a grid up to max_model_len, dense up
  to the step budget, which bounds a chunked pass);
- decode: B = K / C decodes each attending to C keys (context C - 1), at least one decode (B < 1 is
  no batch Dynamo forms: the entry is then one decode over C keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from emulation.config import PoolConfig, TestbedConfig
from emulation.kv_cache import num_usable_blocks
from emulation.profiles import LINKS
from emulation.step_shape import StepShape
from emulation.time_model import StepTimeModel, time_model_for
from emulation.transfer import handoff_time

NPZ_KEYS = (
    "prefill_isl",
    "prefill_ttft_ms",
    "decode_active_kv_tokens",
    "decode_context_length",
    "decode_itl",
)


def prefill_shape(num_new: float, context: float = 0.0, num_prompts: int = 1) -> StepShape:
    """`num_prompts` prompt chunks of `num_new` tokens each over `context` cached tokens, their logits."""
    shape = StepShape()
    for _ in range(num_prompts):
        shape.add(int(num_new), int(context), True)
    return shape


def decode_shape(active_kv: float, context: float) -> StepShape:
    """Dynamo's decode lookup point as a testbed step: B = active_kv / context decodes (at least one),
    each attending to `context` keys. Fractional B keeps the table continuous along both axes."""
    ctx = max(1.0, float(context))
    b = max(1.0, float(active_kv) / ctx)
    return StepShape(
        num_new_tokens=b,  # type: ignore[arg-type]  # totals as floats: the roofline reads sums only
        num_logits=b,  # type: ignore[arg-type]
        num_requests=b,  # type: ignore[arg-type]
        keys_attended=b * ctx,  # type: ignore[arg-type]
        num_context_tokens=b * (ctx - 1.0),  # type: ignore[arg-type]
        num_decodes=b,  # type: ignore[arg-type]
        decode_keys_attended=b * ctx,  # type: ignore[arg-type]
        max_num_new_tokens=1,
    )


def step_ms(model: StepTimeModel, shape: StepShape) -> float:
    return float(model.step_time_of(shape).total_s) * 1000.0


@dataclass(frozen=True)
class Table:
    prefill_isl: np.ndarray
    prefill_ttft_ms: np.ndarray
    decode_active_kv_tokens: np.ndarray
    decode_context_length: np.ndarray
    decode_itl: np.ndarray

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {k: np.asarray(getattr(self, k), dtype=np.float64) for k in NPZ_KEYS}  # Rust reads f64
        np.savez(path, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle

    def prefill_ms(self, tokens: float) -> float:
        """Dynamo's lookup: linear, extrapolated beyond the grid."""
        return float(_interp_extrap(tokens, self.prefill_isl, self.prefill_ttft_ms))

    def decode_ms(self, active_kv: float, context: float) -> float:
        """Dynamo's lookup: bilinear over (active KV tokens, mean context), extrapolated."""
        kv, ctx, z = self.decode_active_kv_tokens, self.decode_context_length, self.decode_itl
        i = int(np.clip(np.searchsorted(kv, active_kv) - 1, 0, len(kv) - 2))
        j = int(np.clip(np.searchsorted(ctx, context) - 1, 0, len(ctx) - 2))
        tx = (active_kv - kv[i]) / (kv[i + 1] - kv[i])
        ty = (context - ctx[j]) / (ctx[j + 1] - ctx[j])
        low = z[i, j] * (1 - tx) + z[i + 1, j] * tx
        high = z[i, j + 1] * (1 - tx) + z[i + 1, j + 1] * tx
        return float(low * (1 - ty) + high * ty)


def _interp_extrap(x: float, xs: np.ndarray, ys: np.ndarray) -> float:
    i = int(np.clip(np.searchsorted(xs, x) - 1, 0, len(xs) - 2))
    t = (x - xs[i]) / (xs[i + 1] - xs[i])
    return float(ys[i] + t * (ys[i + 1] - ys[i]))


def capacity_tokens(cfg: TestbedConfig, pool: PoolConfig) -> int:
    return num_usable_blocks(cfg, pool) * cfg.scheduler.block_size


def build_table(cfg: TestbedConfig, pool: PoolConfig) -> Table:
    """The testbed's step times of one replica of `pool` on Dynamo's grid (module docstring)."""
    model = time_model_for(cfg, pool)
    s = cfg.scheduler
    budget, longest = s.max_num_batched_tokens, s.max_model_len
    isl = np.unique(
        np.concatenate([[1.0], np.arange(64, budget + 1, 64), np.geomspace(budget, longest, 25)]).round()
    )
    prefill = np.array([step_ms(model, prefill_shape(n)) for n in isl])
    ctx = np.unique(np.geomspace(1, longest, 57).round())
    top = 2 * capacity_tokens(cfg, pool)  # logical KV can exceed what is resident (shared prefixes)
    kv = np.unique(np.concatenate([[0.0], np.geomspace(16, top, 64).round()]))
    itl = np.array([[step_ms(model, decode_shape(k, c)) for c in ctx] for k in kv])
    return Table(isl, prefill, kv, ctx, itl)


def engine_args(
    cfg: TestbedConfig, pool: PoolConfig, npz: Path, worker_type: str | None = None
) -> dict[str, Any]:
    """Dynamo's engine arguments for one replica of `pool` (keys: `EngineConfig` in the 1.6.1 binary;
    `worker_type` aggregated | prefill | decode). num_gpu_blocks is what the testbed's requests can hold
    (vLLM's count less its null block)."""
    s = cfg.scheduler
    engine: dict[str, Any] = {
        "block_size": s.block_size,
        "num_gpu_blocks": num_usable_blocks(cfg, pool),
        "max_num_batched_tokens": s.max_num_batched_tokens,
        "max_num_seqs": s.max_num_seqs,
        "max_model_len": s.max_model_len,
        "enable_prefix_caching": s.enable_prefix_caching,
        "enable_chunked_prefill": True,  # the testbed's scheduler always chunks (vLLM v1)
        "timing_model": {"type": "external", "provider": "dynamo_profile", "config": {"path": str(npz)}},
    }
    if worker_type is not None:
        link = LINKS[cfg.kv_transfer.link]
        engine.update(
            worker_type=worker_type,
            kv_transfer_bandwidth=link.bytes_per_s / 1e9,  # GB/s
            kv_transfer_bytes_per_token=cfg.target.profile.kv_bytes_per_token,
            # move only what decode lacks, as the testbed's pull does after decode's own prefix lookup
            kv_transfer_timing_mode="destination_missing",
        )
    return {"engine": engine}


def table_fidelity(cfg: TestbedConfig, pool: PoolConfig, table: Table, seed: int = 0) -> dict[str, float]:
    """How closely the lookups reproduce the passes they were built from, off the grid points (random
    decode batches of 1-256 requests at 256-131k context; prompts up to the budget): worst relative error."""
    model, rng = time_model_for(cfg, pool), np.random.default_rng(seed)
    worst_decode = worst_prefill = 0.0
    for _ in range(200):
        b, c = int(rng.integers(1, 257)), float(np.exp(rng.uniform(np.log(256), np.log(131072))))
        want = step_ms(model, decode_shape(b * c, c))
        worst_decode = max(worst_decode, abs(table.decode_ms(b * c, c) / want - 1))
        n = int(rng.integers(1, cfg.scheduler.max_num_batched_tokens + 1))
        want = step_ms(model, prefill_shape(n))
        worst_prefill = max(worst_prefill, abs(table.prefill_ms(n) / want - 1))
    return {"decode_max_rel_err": worst_decode, "prefill_max_rel_err": worst_prefill}


def prefill_load(cfg: TestbedConfig, pool: PoolConfig, table: Table, prompts: list[int], span_s: float,
                 engines: int) -> tuple[float, float]:  # fmt: skip
    """The share of `engines`' time over `span_s` the trace's prompts alone take, in budget-sized chunks
    each after the prompt's earlier ones (no prefix hits, no decodes beside them): as the testbed prices
    them, as the table does."""
    model, budget = time_model_for(cfg, pool), cfg.scheduler.max_num_batched_tokens
    ours = theirs = 0.0
    for n in prompts:
        for done in range(0, n, budget):
            chunk = min(budget, n - done)
            ours += step_ms(model, prefill_shape(chunk, done))
            theirs += table.prefill_ms(chunk)
    scale = 1000.0 * span_s * engines
    return ours / scale, theirs / scale


def pricing_gaps(cfg: TestbedConfig, pool: PoolConfig, table: Table, median_prompt: int) -> dict[str, str]:
    """What the table prices differently from the testbed, each measured on one pass (ms)."""
    model, budget = time_model_for(cfg, pool), cfg.scheduler.max_num_batched_tokens
    f = "{:,.1f}".format
    fresh, late = (
        step_ms(model, prefill_shape(budget)),
        [step_ms(model, prefill_shape(budget, c)) for c in (32768, 131072)],
    )
    context = (
        f"the table prices a prefill by its new tokens only, while the testbed charges a chunk's attention "
        f"to its earlier context (and reads its KV): a {budget:,}-token chunk costs "
        f"{f(table.prefill_ms(budget))} ms in the table at any context, {f(fresh)} ms in the testbed at "
        f"none, {f(late[0])} ms after 32,768 cached tokens, {f(late[1])} ms after 131,072 (long prompts' "
        f"later chunks and prompts after a prefix hit)"
    )
    chunk, num, c = 2048, 64, 8192
    mixed = prefill_shape(chunk)
    for _ in range(num):
        mixed.add(1, c - 1, True)
    split = table.prefill_ms(chunk) + table.decode_ms(num * c, c)
    mix = (
        f"a pass holding a prompt chunk and decodes costs Dynamo its prefill lookup plus its decode lookup "
        f"(the weights read and the step overhead counted twice), the chunk's first token stamped after the "
        f"prefill part; the testbed prices one roofline over the step and stamps every token at its end: "
        f"{chunk:,} prompt tokens with {num} decodes at {c:,} context, {f(split)} ms in Dynamo (first token "
        f"after {f(table.prefill_ms(chunk))}), {f(step_ms(model, mixed))} ms in the testbed"
    )
    quarter = budget // 4
    batched = (
        f"several prompts' chunks in one pass are priced as one prompt of their total: 4 x {quarter:,} "
        f"tokens, {f(table.prefill_ms(budget))} ms in the table, "
        f"{f(step_ms(model, prefill_shape(quarter, num_prompts=4)))} ms in the testbed"
    )
    gaps = {"prefill_context": context, "mixed_pass": mix, "batched_chunks": batched}
    if cfg.pools.prefill.replicas:
        link, kv_bytes = LINKS[cfg.kv_transfer.link], cfg.target.profile.kv_bytes_per_token
        nbytes = median_prompt * kv_bytes
        blocks = -(-median_prompt // cfg.scheduler.block_size)
        ours = handoff_time(nbytes, blocks, link).total_s * 1000
        theirs = nbytes / link.bytes_per_s * 1000
        gaps["handoff"] = (
            f"a KV handoff takes Dynamo tokens x {kv_bytes:,} B / {link.bytes_per_s / 1e9:g} GB/s; the "
            f"testbed adds {cfg.kv_transfer.link}'s {link.per_transfer_overhead_s * 1e3:g} ms per transfer "
            f"and {link.latency_s * 1e6:g} us latency, queues pulls on the prefill engine's link and notices "
            f"the load at decode's next step boundary: the median prompt ({median_prompt:,} tokens) "
            f"{f(theirs)} ms in Dynamo, {f(ours)} ms in the testbed before queueing"
        )
    return gaps
