"""Every Prometheus family vLLM's engine exports is exported by the testbed's engines alike: the same
name, type, label names (plus the testbed's `role` and `replica`), buckets and pre-created label
values, or it is on the one exclusion list with its reason (`dashboards.vllm_exclusions`).

vLLM's side: `vllm_peer_scripts/metric_families.py` runs vLLM 0.32's engine in process on the tiny Qwen2
(2 heads, 1 KV head: head_dim 32, which vLLM's CPU attention serves) after token-ID traffic whose
prompts share a prefix (prefix-cache hits) over a small KV cache (preemptions); its KV-connector families
come from the stat logger vLLM builds for a NIXL `kv_both` config. The testbed's side: a P/D and a
collocated deployment in virtual time, compute skip, the same scheduler limits and the same requests,
all reaching the engine at time 0 as `LLM.generate` adds them all before vLLM's first step. So the
collocated engine schedules the traffic as vLLM's did, step for step (`test_vllm_engine_conformance.py`
steps this traffic against vLLM's engine), and its scheduling counters equal vLLM's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.engine.runner.tiny_model import ensure_model
from cluster.virtual import run_virtual
from dashboards import metrics as m
from dashboards.exposition import CREATED, sum_series
from dashboards.vllm_exclusions import CACHE_CONFIG_DIFFERENCES, EXCLUDED, HOST_DEPENDENT
from emulation.config import RunnerConfig, TestbedConfig
from messages import ClientRequest
from tests.factories import COLLOCATED, PD, make_config
from tests.vllm_peer import run_script

pytestmark = pytest.mark.parallel  # its `full` tests: the peer's run and a virtual one compared; no time

LIMITS = {"max_model_len": 512, "block_size": 32, "num_gpu_blocks": 20, "max_num_seqs": 8,
          "max_num_batched_tokens": 512}  # fmt: skip
"""Both engines' limits: 20 blocks of 32 tokens (the null block among them) for 8 requests of 168 + 120
tokens, so that requests are preempted; 512 tokens a step and a request."""
NUM_REQUESTS, PREFIX_LEN, OWN_LEN, MAX_TOKENS = 8, 128, 40, 120
NO_RENDER_COST = {"s_per_call": 0.0, "s_per_prompt_token": 0.0}
"""The testbed's render tier renders nothing for token IDs but costs them time (by default two replicas,
0.31 ms a 168-token prompt): the engine's first step would start with two requests, the other six
joining at the second, which preempts once more than vLLM (6, not 5). vLLM's `LLM.generate` on token IDs
adds every request before its first step: so, at no cost, do the testbed's."""
SCHEDULING_COUNTERS = (
    "vllm:num_preemptions", "vllm:iteration_tokens_total", "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits", "vllm:prompt_tokens", "vllm:generation_tokens",
)  # fmt: skip
"""Totals fixed by the schedule alone (a histogram's: its count, here the steps): the collocated engine's
equal vLLM's."""
PER_ENGINE = {"model_name", "engine", "le"}
ALL_ENGINES = ("prefill-0", "decode-0", "mixed-0")
ENGINES = {"engine": ALL_ENGINES, "process": ALL_ENGINES, "nixl_config": ("prefill-0", "decode-0")}
"""The testbed engines that must export vLLM's families of each source (the peer's `source`): every
engine the engine's and its process's, the P/D ones (which run a KV connector in vLLM) the connector's."""
Families = dict[str, dict[str, Any]]


def traffic() -> list[dict[str, Any]]:
    """Token-ID requests whose prompts share a 128-token prefix (4 blocks of 32)."""
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 8192, PREFIX_LEN).tolist()
    return [
        {"prompt_token_ids": prefix + rng.integers(0, 8192, OWN_LEN).tolist(), "max_tokens": MAX_TOKENS}
        for _ in range(NUM_REQUESTS)
    ]


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """vLLM's families (the peer's output); skipped where the peer cannot run."""
    work = tmp_path_factory.mktemp("vllm-families")
    model = ensure_model(RunnerConfig(num_heads=2, num_kv_heads=1))
    (work / "run.json").write_text(json.dumps({**LIMITS, "requests": traffic()}))
    return dict(json.loads(run_script("metric_families.py", str(model), str(work / "run.json"))))


@pytest.fixture(scope="module")
def testbed() -> dict[str, str]:
    """Each testbed engine's final exposition (and the proxy's) after the same requests, P/D and
    collocated."""
    out = {}
    for layer in (PD, COLLOCATED):
        out.update(run_virtual(config_for(layer), client_requests()).metrics)
    return out


def config_for(layer: dict[str, Any]) -> TestbedConfig:
    """The testbed deployment `layer` (P/D or collocated) under vLLM's run's limits."""
    s = LIMITS
    scheduler = {
        "block_size": s["block_size"], "max_model_len": s["max_model_len"],
        "num_gpu_blocks_override": s["num_gpu_blocks"], "max_num_seqs": s["max_num_seqs"],
        "max_num_batched_tokens": s["max_num_batched_tokens"],
    }  # fmt: skip
    workload = {"num_requests": NUM_REQUESTS, "prompt_len": PREFIX_LEN + OWN_LEN, "output_len": MAX_TOKENS}
    return make_config(
        layer,
        runner={"compute": "skip"},
        scheduler=scheduler,
        workload=workload,
        target={"gpu_memory_utilization": 0.92},  # vLLM 0.32's default, for cache_config_info
        render=NO_RENDER_COST,
    )


def client_requests() -> list[ClientRequest]:
    rng = np.random.default_rng(1)
    return [
        ClientRequest(
            f"r{i}", 0.0, r["prompt_token_ids"], r["max_tokens"], rng.integers(0, 8192, MAX_TOKENS).tolist()
        )
        for i, r in enumerate(traffic())
    ]


def described(exposition: str) -> Families:
    """An exposition's families in the peer's shape: type, label names, buckets, label values, sample
    name suffixes (the text format's `<family>_created` gauge is its family's `_created`)."""
    out = {}
    fams = list(text_string_to_metric_families(exposition))
    created = {f.name.removesuffix(CREATED) for f in fams if f.name.endswith(CREATED)}
    for fam in fams:
        if fam.name.endswith(CREATED):
            continue
        labels = sorted({k for s in fam.samples for k in s.labels} - {"le"})
        buckets = None
        if fam.type == "histogram":
            bounds = {s.labels["le"] for s in fam.samples if s.name.endswith("_bucket")}
            buckets = sorted(float(b) for b in bounds if b != "+Inf")
        values = {
            name: sorted({s.labels[name] for s in fam.samples if name in s.labels})
            for name in labels
            if name not in PER_ENGINE and fam.name != m.CACHE_CONFIG_INFO.name
        }
        suffixes = {s.name.removeprefix(fam.name) for s in fam.samples}
        if fam.name in created:
            suffixes.add(CREATED)
        out[fam.name] = {"type": fam.type, "labels": labels, "buckets": buckets, "values": values,
                         "suffixes": sorted(suffixes)}  # fmt: skip
    return out


def differences(theirs: Families, ours: dict[str, Families]) -> list[str]:
    """What differs between vLLM's families (`theirs`) and each testbed engine's (`ours`, by engine
    id), each in a line; excluded families are skipped."""
    problems = []
    testbed_labels = set(m.TESTBED_LABELS)
    for name, fam in sorted(theirs.items()):
        if name in EXCLUDED:
            continue
        for engine in ENGINES[fam["source"]]:
            mine = ours[engine].get(name)
            if mine is None:
                problems.append(f"{name} ({fam['type']}): missing on {engine}, and not excluded")
                continue
            if mine["type"] != fam["type"]:
                problems.append(f"{name}: a {mine['type']} on {engine}, vLLM's is a {fam['type']}")
            if set(mine["labels"]) - testbed_labels != set(fam["labels"]):
                problems.append(f"{name}: labels {mine['labels']} on {engine}, vLLM's {fam['labels']}")
            if mine.get("suffixes") != fam.get("suffixes"):
                problems.append(
                    f"{name}: samples {mine.get('suffixes')} on {engine}, vLLM's {fam.get('suffixes')}"
                )
            if mine["buckets"] != fam["buckets"]:
                problems.append(f"{name}: buckets {mine['buckets']} on {engine}, vLLM's {fam['buckets']}")
            for label, values in fam["values"].items():
                lacking = set(values) - set(mine["values"].get(label, ()))
                if lacking:
                    problems.append(f"{name}: {label} values {sorted(lacking)} missing on {engine}")
    return problems


@pytest.mark.full
def test_every_vllm_family_is_exported_alike_or_excluded(vllm, testbed):
    theirs = vllm["families"]
    ours = {engine: described(text) for engine, text in testbed.items()}
    problems = differences(theirs, ours)
    assert not problems, f"testbed != vLLM {vllm['vllm_version']}:\n" + "\n".join(problems)


@pytest.mark.full
def test_the_exclusion_list_names_only_what_vllm_exports_and_the_testbed_does_not(vllm, testbed):
    ours = {name for text in testbed.values() for name in described(text)}
    assert set(EXCLUDED) <= set(vllm["families"]), set(EXCLUDED) - set(vllm["families"])
    assert not set(EXCLUDED) & ours, set(EXCLUDED) & ours
    assert all(reason.strip() for reason in EXCLUDED.values())


@pytest.mark.full
def test_cache_config_info_holds_vllms_values_under_the_same_config(vllm, testbed):
    theirs = vllm["cache_config_info"]
    for engine in ENGINES["engine"]:
        (sample,) = [
            s for f in text_string_to_metric_families(testbed[engine]) for s in f.samples
            if s.name == m.CACHE_CONFIG_INFO.name
        ]  # fmt: skip
        assert sample.value == 1
        ours = {k: v for k, v in sample.labels.items() if k not in m.TESTBED_LABELS}
        assert ours.keys() == theirs.keys()
        differ = {k: (theirs[k], ours[k]) for k in theirs if theirs[k] != ours[k]}
        assert differ.keys() <= CACHE_CONFIG_DIFFERENCES.keys(), differ  # every difference explained
        assert CACHE_CONFIG_DIFFERENCES.keys() - HOST_DEPENDENT <= differ.keys(), differ  # and still there


def _total(families: Families, name: str) -> float:
    return float(families[name]["total"])


@pytest.mark.full
def test_the_added_families_keep_vllms_invariants(vllm, testbed):
    """vLLM's traffic preempted and hit the prefix cache (the comparison saw the families in use), and
    the sums that hold between vLLM's families hold on both sides: cached prompt tokens by source add
    up to local and external prefix hits; each finished request observes its preemptions and its `n`."""
    theirs = vllm["families"]
    assert _total(theirs, "vllm:num_preemptions") > 0 and _total(theirs, "vllm:prefix_cache_hits") > 0
    assert _total(theirs, "vllm:estimated_flops_per_gpu") > 0
    sides = {"vLLM": theirs, **{e: _totals(testbed[e]) for e in ENGINES["engine"]}}
    for side, fam in sides.items():
        cached = _total(fam, "vllm:prompt_tokens_cached_by_source")
        hits = _total(fam, "vllm:prefix_cache_hits") + _total(fam, "vllm:external_prefix_cache_hits")
        assert cached == hits, side
        finished = _total(fam, "vllm:request_success")
        assert _total(fam, "vllm:request_params_n") == finished == NUM_REQUESTS, side
        assert _total(fam, "vllm:request_num_preemptions") == finished, side
        assert _total(fam, "vllm:engine_sleep_state") == 1, side  # awake
    for engine in ENGINES["engine"]:
        expo = [testbed[engine]]
        preempted = sum_series(expo, m.REQUEST_NUM_PREEMPTIONS.sum)
        assert preempted == sum_series(expo, m.NUM_PREEMPTIONS.exposed), engine
        for spec in (m.ESTIMATED_FLOPS, m.ESTIMATED_READ_BYTES, m.ESTIMATED_WRITE_BYTES):
            assert sum_series(expo, spec.exposed) > 0, (engine, spec.name)
    pd = [testbed["decode-0"]]
    external = sum_series(pd, m.PROMPT_TOKENS_BY_SOURCE.exposed, source="external_kv_transfer")
    assert sum_series(pd, m.PROMPT_TOKENS_CACHED_BY_SOURCE.exposed, source="p2p") == external > 0


@pytest.mark.full
def test_the_collocated_engine_schedules_the_traffic_as_vllm_does(vllm, testbed):
    """Both sides were driven alike: the same steps, preemptions, prefix-cache lookups and hits, and
    tokens (vLLM's traffic preempts and hits, so the check is not vacuous)."""
    theirs, ours = vllm["families"], _totals(testbed["mixed-0"])
    assert _total(theirs, "vllm:num_preemptions") > 0 and _total(theirs, "vllm:prefix_cache_hits") > 0
    differ = {n: (_total(theirs, n), _total(ours, n)) for n in SCHEDULING_COUNTERS}
    assert all(a == b for a, b in differ.values()), f"vLLM's, the testbed's: {differ}"


def _totals(exposition: str) -> Families:
    """Each family's `total` as the peer sums it: a counter's or gauge's samples, a histogram's counts."""
    out = {}
    for fam in text_string_to_metric_families(exposition):
        counted = [s for s in fam.samples if s.name.endswith("_count") or fam.type != "histogram"]
        out[fam.name] = {"total": math.fsum(s.value for s in counted)}
    return out


def test_the_comparison_catches_each_kind_of_difference():
    """A missing family, another type, other labels, other buckets, a label value not pre-created: each
    is a line; an excluded family is none."""
    fam = {"type": "histogram", "labels": ["engine", "model_name"], "buckets": [1.0, 2.0], "values": {}}
    theirs = {
        "vllm:a": {**fam, "source": "engine"},
        "vllm:b": {**fam, "source": "nixl_config"},
        next(iter(EXCLUDED)): {**fam, "source": "engine"},
    }
    ours_fam = {**fam, "labels": ["engine", "model_name", "replica", "role"]}
    same = {e: {"vllm:a": ours_fam, "vllm:b": ours_fam} for e in ENGINES["engine"]}
    assert differences(theirs, same) == []
    doctored = [
        {"type": "gauge"},
        {"labels": ["engine", "replica", "role"]},
        {"buckets": [1.0, 5.0]},
        {"suffixes": ["_count", "_sum"]},  # (no `_created`)
        {"values": {}},
    ]
    theirs["vllm:a"]["values"] = {"reason": ["x"]}
    for change in doctored:
        ours = {e: {"vllm:a": {**ours_fam, "values": {"reason": ["x"]}, **change}, "vllm:b": ours_fam}
                for e in ENGINES["engine"]}  # fmt: skip
        assert len(differences(theirs, ours)) == len(ENGINES["engine"]), change
    missing = {e: {"vllm:a": {**ours_fam, "values": {"reason": ["x"]}}} for e in ENGINES["engine"]}
    assert [p for p in differences(theirs, missing) if "missing on" in p] == [
        "vllm:b (histogram): missing on prefill-0, and not excluded",
        "vllm:b (histogram): missing on decode-0, and not excluded",
    ]


def test_the_peer_script_uses_vllm_and_the_standard_library_only():
    script = Path(__file__).parent / "vllm_peer_scripts" / "metric_families.py"
    imports = {
        ln.split()[1].split(".")[0]
        for ln in script.read_text().splitlines()
        if ln.startswith(("import ", "from "))
    }
    assert imports <= {
        "__future__",
        "copy",
        "importlib",
        "json",
        "os",
        "sys",
        "typing",
        "vllm",
        "prometheus_client",
    }
