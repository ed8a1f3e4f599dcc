"""Prometheus series: vLLM's names, types and buckets, and values that trace back to the results table."""

import math
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import messages.result
from cluster.virtual import run_virtual
from dashboards import metrics as m
from dashboards.exposition import merged_text_expositions, sample_values, sum_series
from messages.latency import HANDOFF_PARTS, percentile
from messages.stats import KV_FETCH_STAGES
from tests.factories import COLLOCATED, PD, make_config
from workloads.latency import percentiles

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "vllm-metrics.md"
WORKLOAD = {"num_requests": 12, "rate": 0.6, "prompt_len": 2048, "output_len": 48}


@pytest.fixture(scope="module")
def runs():
    """One virtual run per design kind (compute skip): the results table and every actor's exposition."""
    out = {}
    # P/D: an SLO on each request's p99 ITL too (the proxy then sorts its gaps), met by some only.
    slos = {"pd": {"slos": ["ttft<=2s,tpot<=30ms", "itl<=24.3ms,ttft<=3s"]}, "collocated": {}}
    for name, layer in (("collocated", COLLOCATED), ("pd", PD)):
        cfg = make_config(layer, runner={"compute": "skip"}, workload=WORKLOAD, design=name, **slos[name])
        out[name] = run_virtual(cfg)
    return out


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_every_reference_series_is_exported_with_its_type_and_labels(runs):
    rows = [ln for ln in REFERENCE.read_text().splitlines() if ln.startswith("| `vllm:")]
    names = set(re.findall(r"`(vllm:[a-z0-9_]+)`", "\n".join(rows)))
    assert len(names) > 30
    text = runs["pd"].metrics["decode-0"]
    exposed = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    for name in names:
        assert name in exposed or f"{name}_count" in exposed, name
    for removed in ("vllm:time_per_output_token_seconds", "vllm:gpu_cache_usage_perc"):
        assert removed not in text
    specs = {spec.name: spec for spec in m.ALL_SERIES}
    for f in text_string_to_metric_families(text):
        if f.name.endswith("_created"):  # (`test_counters_and_histograms_carry_created_times`)
            continue
        if f.type == "counter":
            assert all(s.name.endswith("_total") for s in f.samples), f.name
        common = set(specs[f.name].common)  # vLLM's admission and cache-config families lack one
        assert {"role", "replica"} <= common <= {"model_name", "engine", "role", "replica"}, f.name
        for s in f.samples:
            assert common <= set(s.labels), s
    reasons = {
        s.labels["finished_reason"]
        for s in families(text)["vllm:request_success"].samples
        if s.name == "vllm:request_success_total"
    }
    assert reasons == {"stop", "length", "abort", "error", "repetition"}


def test_counters_and_histograms_carry_created_times(runs):
    """As vLLM 0.32's: every counter and histogram series has its `_created` time (a gauge of its own in
    the text format, with the series' labels; the wall clock), no gauge has one, and no sum meets it."""
    text = runs["pd"].metrics["decode-0"]
    fams = families(text)
    created = {name.removesuffix("_created") for name in fams if name.endswith("_created")}
    assert created == {f.name for f in fams.values() if f.type in ("counter", "histogram")}
    for name in created:
        last = "_total" if fams[name].type == "counter" else "_count"
        series = {tuple(sorted(s.labels.items())) for s in fams[name].samples if s.name.endswith(last)}
        times = {tuple(sorted(s.labels.items())): s.value for s in fams[f"{name}_created"].samples}
        assert fams[f"{name}_created"].type == "gauge" and times.keys() == series, name
        assert all(1.7e9 < t <= time.time() for t in times.values()), name
    expos, df = list(runs["pd"].metrics.values()), runs["pd"].results
    assert sum_series(expos, m.GENERATION_TOKENS.exposed, role="decode") == df["num_output_tokens"].sum()
    with pytest.raises(ValueError, match="creation time"):
        sum_series([text], "vllm:generation_tokens_created")


def test_merged_expositions_keep_every_value_and_created_time(runs):
    """One scrape of several actors (`testbed serve`'s /metrics): every sample of each, the `_created`
    times among them, and the same sums."""
    texts = list(runs["pd"].metrics.values())
    merged = merged_text_expositions(texts)
    each = [sample_values(t) for t in texts]
    assert sample_values(merged) == {k: v for values in each for k, v in values.items()}
    created = {(s.name, tuple(s.labels.items())) for t in texts for s in _created_samples(t)}
    assert {(s.name, tuple(s.labels.items())) for s in _created_samples(merged)} == created
    for name in (m.GENERATION_TOKENS.exposed, m.TTFT.count, m.TTFT.sum, m.ADMISSION_REJECTIONS.exposed):
        assert sum_series([merged], name) == sum_series(texts, name), name


def _created_samples(text):
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name.endswith("_created")]


def _bucket_line(title):
    line = next(ln for ln in REFERENCE.read_text().splitlines() if ln.startswith(f"- {title} `"))
    return tuple(float(x) for x in line.split("`")[1].strip("[]").split(","))


def _reference_row(name):
    row = next(ln for ln in REFERENCE.read_text().splitlines() if ln.startswith(f"| `{name}`"))
    return tuple(float(x) for x in row.rsplit("`[", 1)[1].split("]")[0].split(","))


def test_buckets_are_vllms():
    assert _bucket_line("TTFT") == m.TTFT_BUCKETS
    assert _bucket_line("ITL") == m.ITL_BUCKETS
    assert _bucket_line("REQ") == m.REQ_BUCKETS
    assert _reference_row("vllm:iteration_tokens_total") == m.ITERATION_BUCKETS
    assert _reference_row("vllm:nixl_xfer_time_seconds") == m.NIXL_XFER_BUCKETS
    assert _reference_row("vllm:nixl_post_time_seconds") == m.NIXL_POST_BUCKETS
    assert _reference_row("vllm:nixl_num_descriptors") == m.NIXL_DESCRIPTOR_BUCKETS
    assert m.NIXL_BYTES_BUCKETS[0] == 2048 and m.NIXL_BYTES_BUCKETS[-1] == 8 * 1024**3
    assert m.buckets_125(100) == (1, 2, 5, 10, 20, 50, 100)


def test_ttft_histogram_count_and_sum_match_the_results_table(runs):
    for name, run in runs.items():
        df = run.results
        expos = list(run.metrics.values())
        ttft = df["ttft_s"].dropna()
        assert sum_series(expos, m.CLIENT_TTFT.count) == len(ttft) == len(df)
        assert math.isclose(sum_series(expos, m.CLIENT_TTFT.sum), ttft.sum(), rel_tol=1e-9)
        if name == "collocated":  # the engine sees the request once it is rendered, as vLLM's does
            assert sum_series(expos, m.TTFT.count) == len(ttft)
            engine_ttft = ttft - df["render_s"]
            assert math.isclose(sum_series(expos, m.TTFT.sum), engine_ttft.sum(), rel_tol=1e-9)
        else:  # decode's TTFT starts when the request reaches it: after prefill
            decode = sum_series(expos, m.TTFT.sum, role="decode")
            assert sum_series(expos, m.TTFT.count, role="decode") == len(df)
            assert math.isclose(
                decode, (df["token_times_s"].map(lambda t: t[0]) - df["prefill_done_s"]).sum()
            )
            assert decode < ttft.sum()


def test_counters_trace_to_the_results_table(runs):
    for name, run in runs.items():
        df = run.results
        expos = list(run.metrics.values())
        n = len(df)
        role = "mixed" if name == "collocated" else "decode"
        assert sum_series(expos, m.GENERATION_TOKENS.exposed, role=role) == df["num_output_tokens"].sum()
        assert sum_series(expos, m.REQUEST_SUCCESS.exposed, role=role, finished_reason="length") == n
        assert sum_series(expos, m.E2E.count, role=role) == n
        assert sum_series(expos, m.ITL.count, role=role) == (df["num_output_tokens"] - 1).sum()
        assert math.isclose(
            sum_series(expos, m.ITL.sum, role=role),
            float(sum(np.sum(np.diff(t)) for t in df["token_times_s"])),
        )
        assert sum_series(expos, m.REQUESTS_FINISHED.exposed, finished_reason="length") == n
        for slo, attained in run.summary["slo_attainment"].items():
            assert sum_series(expos, m.SLO_MET.exposed, slo=slo) == round(attained * n)
        assert math.isclose(sum_series(expos, m.WORST_GAP.name), df["max_gap_s"].max())
    pd_df = runs["pd"].results
    pd_expos = list(runs["pd"].metrics.values())
    assert sum_series(pd_expos, m.NIXL_BYTES.sum) == pd_df["kv_bytes"].sum() > 0
    assert sum_series(pd_expos, m.NIXL_XFER_TIME.count) == len(pd_df)
    assert math.isclose(sum_series(pd_expos, m.KV_HANDOFF.sum, link="pcie4-x16"), pd_df["handoff_s"].sum())
    prompt = pd_df["num_prompt_tokens"].sum()
    assert sum_series(pd_expos, m.PROMPT_TOKENS.exposed, role="prefill") == prompt
    external = sum_series(pd_expos, m.PROMPT_TOKENS_BY_SOURCE.exposed, source="external_kv_transfer")
    assert external == prompt - len(pd_df)  # decode recomputes the last prompt token
    for expo in pd_expos[:-1]:  # engines: idle at the end, every block free
        fam = families(expo)
        assert fam["vllm:num_requests_running"].samples[0].value == 0
        assert fam["vllm:kv_cache_usage_perc"].samples[0].value == 0


def test_preemptions_and_prefix_hits_are_counted():
    cfg = make_config(
        COLLOCATED,
        runner={"compute": "skip"},
        scheduler={"num_gpu_blocks_override": 40, "max_model_len": 512},
        workload={"num_requests": 4, "rate": 50, "prompt_len": 160, "output_len": 200},
    )
    run = run_virtual(cfg)
    expos = list(run.metrics.values())
    assert sum_series(expos, m.NUM_PREEMPTIONS.exposed) == run.summary["num_preemptions"] > 0
    assert sum_series(expos, m.PREFIX_CACHE_QUERIES.exposed) >= 4 * 160
    report = run.engine_reports["mixed-0"]
    assert sum_series(expos, m.PREFIX_CACHE_HITS.exposed) == report.scheduler.num_prefix_cache_hits


def test_actors_record_without_importing_pandas_or_transformers():
    """A heavy import in the middle of a live run (the proxy's first finished request once imported
    pandas) stalls the engines sharing the host's cores: live TTFT drifted by 12-200 ms."""
    code = (
        "import sys\n"
        "from cluster.hosts import EngineHost, ProxyHost\n"
        "from messages import RequestResult\n"
        "from dashboards.recorders import ProxyMetrics\n"
        "from cluster.config_load import load_designs\n"
        "result = RequestResult('r', 0.0, 8, 2, 'length')\n"
        "result.output_token_ids, result.token_times_s = [1, 2], [0.1, 0.2]\n"
        "ProxyMetrics(load_designs('guide-l40s', ['pd-fast'], [])[0]).on_request_done(result)\n"
        "print(sorted(m for m in ('pandas', 'transformers', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_request_percentile_is_numpys_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    for n in [*range(1, 40), 127, 255, 1000]:
        for values in (rng.exponential(0.03, n), rng.integers(0, 4, n) * 0.025):  # ties too
            for q in (50.0, 90.0, 99.0, 100.0):
                assert percentile(sorted(values.tolist()), q) == float(np.percentile(values, q))
            qs = (50.0, 90.0, 99.0, 100.0)
            assert percentiles(values, qs) == [float(np.percentile(values, q)) for q in qs]


def test_the_proxys_latency_and_handoff_histograms_sum_the_results_tables_columns(runs):
    """The proxy records each request's row of the results table: the same latencies and handoff parts."""
    for run in runs.values():
        df = run.results
        proxy = [run.metrics["proxy"]]
        assert sum_series(proxy, m.CLIENT_E2E.sum) == pytest.approx(df["e2el_s"].sum(), rel=1e-12)
        assert sum_series(proxy, m.MAX_GAP.count) == df["max_gap_s"].notna().sum()
        assert sum_series(proxy, m.MAX_GAP.sum) == pytest.approx(df["max_gap_s"].sum(), rel=1e-12)
    pd_df = runs["pd"].results
    pd_proxy = [runs["pd"].metrics["proxy"]]
    for part in HANDOFF_PARTS:
        column = pd_df[f"handoff_{part}_s"]
        assert sum_series(pd_proxy, m.KV_HANDOFF_PARTS.count, part=part) == column.notna().sum() > 0
        total = sum_series(pd_proxy, m.KV_HANDOFF_PARTS.sum, part=part)
        assert total == pytest.approx(column.sum(), rel=1e-12, abs=1e-12)


def test_each_requests_latencies_and_handoff_parts_are_computed_once(monkeypatch):
    """The proxy's metrics and the results table (with the summary's SLO columns) read one computation
    per request: counted through the functions `RequestResult` calls."""
    counts = {"latencies": 0, "handoff": 0}

    def counting(name, fn):
        def wrapped(*args):
            counts[name] += 1
            return fn(*args)

        return wrapped

    monkeypatch.setattr(
        messages.result, "request_latencies", counting("latencies", messages.result.request_latencies)
    )
    monkeypatch.setattr(messages.result, "handoff_parts", counting("handoff", messages.result.handoff_parts))
    cfg = make_config(PD, runner={"compute": "skip"}, workload=WORKLOAD, slos=["ttft<=2s"])
    run = run_virtual(cfg)
    assert len(run.results) == WORKLOAD["num_requests"]
    assert counts == {"latencies": WORKLOAD["num_requests"], "handoff": WORKLOAD["num_requests"]}


def test_waiting_requests_are_split_by_reason_and_kv_loads_by_stage(monkeypatch):
    """Decode's waiting requests: those whose KV is loading are `deferred` (vLLM's skipped waiting
    ones), the rest wait for `capacity`; its KV loads go through vLLM's stages (waiting for blocks,
    loading, loaded and not yet running); a collocated engine has no KV loads."""
    from dashboards.recorders import EngineMetrics

    seen: dict[str, list] = {}
    on_state = EngineMetrics.on_state

    def spy(self, stats):
        seen.setdefault(self.labels["role"], []).append(stats)
        on_state(self, stats)

    monkeypatch.setattr(EngineMetrics, "on_state", spy)
    burst = {"num_requests": 16, "rate": 50, "prompt_len": 512, "output_len": 64}
    for layer in (PD, COLLOCATED):
        run_virtual(
            make_config(layer, runner={"compute": "skip"}, workload=burst, scheduler={"max_num_seqs": 4})
        )
    decode = seen["decode"]
    assert all(s.num_deferred_waiting_reqs == s.num_kv_fetch_reqs_by_stage[1] for s in decode)
    assert all(sum(s.num_kv_fetch_reqs_by_stage) <= s.num_waiting_reqs for s in decode)
    for stage in range(3):
        assert max(s.num_kv_fetch_reqs_by_stage[stage] for s in decode) > 0, KV_FETCH_STAGES[stage]
    assert all(s.num_kv_fetch_reqs_by_stage == (0, 0, 0) for s in seen["mixed"])
    assert max(s.num_waiting_reqs for s in seen["mixed"]) > 0


def test_running_values_reach_every_collection():
    """A scrape of some families (`name[]`), a whole one, and one series whatever its labels' order."""
    from dashboards.recorders import ProxyMetrics

    rec = ProxyMetrics(make_config(COLLOCATED))
    rec.on_routed("mixed", "mixed-0", 3, 10)
    assert rec.child(m.ROUTED, routed_to="mixed-0", pool="mixed") is rec.child(
        m.ROUTED, pool="mixed", routed_to="mixed-0"
    )
    some = rec.registry.restricted_registry([m.ROUTED_OVERLAP_BLOCKS.name + "_total"])
    values = {s.name: s.value for f in some.collect() for s in f.samples if not s.name.endswith("_created")}
    assert values == {m.ROUTED_OVERLAP_BLOCKS.name + "_total": 3.0}
    rec.on_routed("mixed", "mixed-0", 2, 10)
    assert sum_series([rec.exposition()], m.ROUTED_OVERLAP_BLOCKS.name + "_total") == 5.0
