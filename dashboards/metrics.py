"""Every Prometheus series the testbed exports: names, types, labels and buckets, and the hooks that record.

vLLM's own series keep vLLM's names, labels and buckets exactly (`../shared/reference/vllm-metrics.md`),
so vLLM's and llm-d's dashboards work unchanged; the testbed's additions live under `testbed:`. Every
value is in emulated seconds. Code records only through the `on_<event>` hooks of `EngineMetrics` and
`ProxyMetrics`; dashboards refer to series only through the `MetricSpec` constants below.

Each engine and proxy owns a registry; a live actor serves it at `/metrics`, and every run writes its
final exposition beside the results (`metrics/<actor>.prom`).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
    make_wsgi_app,
)

if TYPE_CHECKING:
    from actors.engine.block_manager import BlockManager
    from actors.engine.kv_transfer import TransferPlan
    from actors.engine.request import Request
    from actors.engine.scheduler import Scheduler
    from actors.messages import RequestResult
    from cluster.config import TestbedConfig

disable_created_metrics()  # vLLM exports no `_created` series

COMMON_LABELS = ("model_name", "engine", "role", "replica")
"""On every series: vLLM's `model_name` and `engine`, and the testbed's `role` and `replica`."""
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
REQ_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
NIXL_XFER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_POST_BUCKETS = (0.001, *NIXL_XFER_BUCKETS)
NIXL_BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 24, 2))
NIXL_DESCRIPTOR_BUCKETS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)
HANDOFF_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 1.5, 2.0, 5.0, 10.0, 30.0)
TOKENS_125 = "1-2-5 up to max_model_len"


def buckets_125(max_model_len: int) -> tuple[float, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... while <= max_model_len."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_model_len:
                return tuple(out)
            out.append(float(value))
        exponent += 1


@dataclass(frozen=True)
class MetricSpec:
    """One series as declared; `exposed` is the name Prometheus stores (counters gain `_total`)."""

    name: str
    kind: Literal["counter", "gauge", "histogram"]
    doc: str
    labels: tuple[str, ...] = ()
    """Labels beyond COMMON_LABELS."""
    buckets: tuple[float, ...] | str | None = None

    @property
    def exposed(self) -> str:
        return f"{self.name}_total" if self.kind == "counter" else self.name

    @property
    def bucket(self) -> str:
        return f"{self.name}_bucket"

    @property
    def sum(self) -> str:
        return f"{self.name}_sum"

    @property
    def count(self) -> str:
        return f"{self.name}_count"


def _h(name: str, doc: str, buckets: tuple[float, ...] | str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, "histogram", doc, labels, buckets)


def _c(name: str, doc: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return MetricSpec(name, "counter", doc, labels)


def _g(name: str, doc: str) -> MetricSpec:
    return MetricSpec(name, "gauge", doc)


# ---- vLLM engine series ------------------------------------------------------------------------------
NUM_REQUESTS_RUNNING = _g("vllm:num_requests_running", "Number of requests in model execution batches.")
NUM_REQUESTS_WAITING = _g("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
KV_CACHE_USAGE = _g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
PREFIX_CACHE_QUERIES = _c("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.")  # fmt: skip
PREFIX_CACHE_HITS = _c("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
PROMPT_TOKENS = _c("vllm:prompt_tokens", "Number of prefill tokens processed.")
PROMPT_TOKENS_BY_SOURCE = _c(
    "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ("source",)
)
GENERATION_TOKENS = _c("vllm:generation_tokens", "Number of generation tokens processed.")
REQUEST_SUCCESS = _c("vllm:request_success", "Count of successfully processed requests.", ("finished_reason",))  # fmt: skip
NUM_PREEMPTIONS = _c("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
MM_CACHE_QUERIES = _c("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.")  # fmt: skip
MM_CACHE_HITS = _c("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.")
TTFT = _h("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS)
ITL = _h("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
TPOT = _h("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)  # fmt: skip
E2E = _h("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQ_BUCKETS)
QUEUE_TIME = _h("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", REQ_BUCKETS)  # fmt: skip
INFERENCE_TIME = _h("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", REQ_BUCKETS)  # fmt: skip
PREFILL_TIME = _h("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", REQ_BUCKETS)  # fmt: skip
DECODE_TIME = _h("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", REQ_BUCKETS)  # fmt: skip
REQUEST_PROMPT_TOKENS = _h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKENS_125)
REQUEST_GENERATION_TOKENS = _h("vllm:request_generation_tokens", "Number of generation tokens processed.", TOKENS_125)  # fmt: skip
REQUEST_MAX_TOKENS = _h("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", TOKENS_125)  # fmt: skip
REQUEST_MAX_GENERATION_TOKENS = _h("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.", TOKENS_125)  # fmt: skip
REQUEST_PREFILL_KV_COMPUTED = _h("vllm:request_prefill_kv_computed_tokens", "Histogram of new KV tokens computed during prefill (excluding cached tokens).", TOKENS_125)  # fmt: skip
ITERATION_TOKENS = _h("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_BUCKETS)  # fmt: skip

# ---- KV handoff, NIXL connector names (recorded by the side that starts the transfer) ---------------
NIXL_XFER_TIME = _h("vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache transfers.", NIXL_XFER_BUCKETS)  # fmt: skip
NIXL_POST_TIME = _h("vllm:nixl_post_time_seconds", "Histogram of transfer post time for NIXL KV Cache transfers.", NIXL_POST_BUCKETS)  # fmt: skip
NIXL_BYTES = _h("vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV Cache transfers.", NIXL_BYTES_BUCKETS)  # fmt: skip
NIXL_DESCRIPTORS = _h("vllm:nixl_num_descriptors", "Histogram of number of descriptors per NIXL KV Cache transfers.", NIXL_DESCRIPTOR_BUCKETS)  # fmt: skip
NIXL_FAILED_TRANSFERS = _c("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers.")
NIXL_FAILED_NOTIFICATIONS = _c("vllm:nixl_num_failed_notifications", "Number of failed NIXL KV Cache notifications.")  # fmt: skip
NIXL_KV_EXPIRED = _c("vllm:nixl_num_kv_expired_reqs", "Number of requests that had their KV expire.")

# ---- the testbed's own ---------------------------------------------------------------------------------
TIME_SCALE = _g("testbed:time_scale", "Wall seconds per emulated second (multiply per-wall-second rates by it).")  # fmt: skip
STEPS = _c("testbed:steps", "Engine steps run.")
LAGGED_STEPS = _c("testbed:lagged_steps", "Steps whose real work overran their emulated budget (lag).")
LAGGED_KV_TRANSFERS = _c("testbed:lagged_kv_transfers", "KV pulls whose real move finished after the emulated transfer.")  # fmt: skip
MAX_OVERRUN = _g("testbed:max_overrun_seconds", "Worst overrun of a step or KV pull so far, emulated seconds.")  # fmt: skip
BUSY = _c("testbed:busy_seconds", "Emulated seconds the engine spent in steps (utilisation = its rate).")
KV_HANDOFF = _h("testbed:kv_handoff_seconds", "KV handoff time per request (transfer start to done) by link.", HANDOFF_BUCKETS, ("link",))  # fmt: skip
# Client-side (proxy): what the user sees, end to end through every role.
CLIENT_TTFT = _h("testbed:time_to_first_token_seconds", "Client-visible time to first token (proxy).", TTFT_BUCKETS)  # fmt: skip
CLIENT_E2E = _h("testbed:e2e_request_latency_seconds", "Client-visible end-to-end latency (proxy).", REQ_BUCKETS)  # fmt: skip
MAX_GAP = _h("testbed:max_inter_token_gap_seconds", "Each request's worst gap between two tokens (proxy).", ITL_BUCKETS)  # fmt: skip
WORST_GAP = _g("testbed:worst_inter_token_gap_seconds", "The worst gap between two tokens of any request so far.")  # fmt: skip
REQUESTS_FINISHED = _c("testbed:requests_finished", "Requests the proxy finished, by how they ended.", ("finished_reason",))  # fmt: skip
SLO_MET = _c("testbed:slo_met", "Requests that finished within every bound of an SLO set (goodput = rate).", ("slo",))  # fmt: skip

ENGINE_SERIES = (
    NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING, KV_CACHE_USAGE, PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS,
    PROMPT_TOKENS, PROMPT_TOKENS_BY_SOURCE, GENERATION_TOKENS, REQUEST_SUCCESS, NUM_PREEMPTIONS,
    MM_CACHE_QUERIES, MM_CACHE_HITS, TTFT, ITL, TPOT, E2E, QUEUE_TIME, INFERENCE_TIME, PREFILL_TIME,
    DECODE_TIME, REQUEST_PROMPT_TOKENS, REQUEST_GENERATION_TOKENS, REQUEST_MAX_TOKENS,
    REQUEST_MAX_GENERATION_TOKENS, REQUEST_PREFILL_KV_COMPUTED, ITERATION_TOKENS, NIXL_XFER_TIME,
    NIXL_POST_TIME, NIXL_BYTES, NIXL_DESCRIPTORS, NIXL_FAILED_TRANSFERS, NIXL_FAILED_NOTIFICATIONS,
    NIXL_KV_EXPIRED, TIME_SCALE, STEPS, LAGGED_STEPS, LAGGED_KV_TRANSFERS, MAX_OVERRUN, BUSY, KV_HANDOFF,
)  # fmt: skip
# Render tier: CPU seconds of real work (CPU ms per 1k tokens = cpu rate / tokens rate), calls per replica.
RENDER_CPU = _c("testbed:render_cpu_seconds", "CPU seconds spent rendering (templates) or derendering (detokenize + parse).", ("op",))  # fmt: skip
RENDER_TOKENS = _c("testbed:render_tokens", "Tokens rendered (prompt) or derendered (output).", ("op",))
RENDER_CALLS = _c("testbed:render_calls", "Render calls (one per request) and derender calls (one per chunk).", ("op",))  # fmt: skip

PROXY_SERIES = (TIME_SCALE, CLIENT_TTFT, CLIENT_E2E, MAX_GAP, WORST_GAP, REQUESTS_FINISHED, SLO_MET)
RENDER_SERIES = (RENDER_CPU, RENDER_TOKENS, RENDER_CALLS)
ALL_SERIES = tuple(dict.fromkeys(ENGINE_SERIES + PROXY_SERIES + RENDER_SERIES))


class _Registry:
    """A registry holding `specs`, each bound to one actor's common labels (extra labels stay open)."""

    def __init__(self, specs: tuple[MetricSpec, ...], labels: dict[str, str], max_model_len: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.labels = labels
        self._metrics: dict[str, Counter | Gauge | Histogram] = {}
        self._children: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        # Series without extra labels are exported at zero from the start, as vLLM's are: a rate of
        # "nothing happened" is 0, not missing data.
        for spec in specs:
            names = (*COMMON_LABELS, *spec.labels)
            if spec.kind == "counter":
                metric: Counter | Gauge | Histogram = Counter(
                    spec.name, spec.doc, names, registry=self.registry
                )
            elif spec.kind == "gauge":
                metric = Gauge(spec.name, spec.doc, names, registry=self.registry)
            else:
                b = buckets_125(max_model_len) if spec.buckets == TOKENS_125 else spec.buckets
                assert isinstance(b, tuple)
                metric = Histogram(spec.name, spec.doc, names, buckets=b, registry=self.registry)
            self._metrics[spec.name] = metric
            if not spec.labels:
                self.child(spec)

    def child(self, spec: MetricSpec, **extra: str) -> Any:
        """The series of `spec` for this actor (and `extra` label values); created at zero if new.

        Cached: prometheus_client's `labels()` lookup costs more than the observation itself.
        """
        key = (spec.name, tuple(extra.items()))
        series = self._children.get(key)
        if series is None:
            series = self._children[key] = self._metrics[spec.name].labels(**self.labels, **extra)
        return series

    def exposition(self) -> str:
        return generate_latest(self.registry).decode()


def _labels(cfg: TestbedConfig, role: str, replica: int) -> dict[str, str]:
    name = cfg.target.served_model_name or cfg.target.model
    return {"model_name": name, "engine": str(replica), "role": role, "replica": str(replica)}


class EngineMetrics(_Registry):
    """An engine's series. The engine calls the hooks; nothing else writes to the registry."""

    def __init__(self, cfg: TestbedConfig, role: str, replica: int) -> None:
        super().__init__(ENGINE_SERIES, _labels(cfg, role, replica), cfg.scheduler.max_model_len)
        self._num_layers = _num_layers(cfg)
        self._link = cfg.kv_transfer.link
        for reason in FINISHED_REASONS:
            self.child(REQUEST_SUCCESS, finished_reason=reason)
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            self.child(PROMPT_TOKENS_BY_SOURCE, source=source)
        self.child(TIME_SCALE).set(cfg.clock.scale if cfg.clock.mode == "live" else 1.0)
        self._seen_queries = self._seen_hits = self._seen_preemptions = 0
        self._max_overrun_s = 0.0
        self._ttft, self._itl, self._gen = self.child(TTFT), self.child(ITL), self.child(GENERATION_TOKENS)

    def on_step(
        self,
        step_s: float,
        num_scheduled_tokens: int,
        overrun_s: float,
        sched: Scheduler,
        blocks: BlockManager,
    ) -> None:
        """After each step (its outputs stamped): the step's size and lag, then the engine's state."""
        self.child(ITERATION_TOKENS).observe(num_scheduled_tokens)
        self.child(STEPS).inc()
        self.child(BUSY).inc(step_s)
        if overrun_s > 0:
            self.child(LAGGED_STEPS).inc()
            self._overrun(overrun_s)
        self.on_state(sched, blocks)

    def on_state(self, sched: Scheduler, blocks: BlockManager) -> None:
        """Gauges and the counters the scheduler and block manager keep (at steps and on arrivals)."""
        self.child(NUM_REQUESTS_RUNNING).set(len(sched.running))
        self.child(NUM_REQUESTS_WAITING).set(len(sched.waiting) + len(sched.recving))
        self.child(KV_CACHE_USAGE).set(blocks.usage)
        q, h, p = blocks.num_prefix_cache_queries, blocks.num_prefix_cache_hits, sched.num_preemptions
        if q != self._seen_queries:
            self.child(PREFIX_CACHE_QUERIES).inc(q - self._seen_queries)
            self.child(PREFIX_CACHE_HITS).inc(h - self._seen_hits)
        if p != self._seen_preemptions:
            self.child(NUM_PREEMPTIONS).inc(p - self._seen_preemptions)
        self._seen_queries, self._seen_hits, self._seen_preemptions = q, h, p

    def on_new_token(self, req: Request, now_s: float) -> None:
        """A token of `req` was emitted at `now_s`; called before the engine stamps it on `req.times`."""
        t = req.times
        if t.first_token_s is None:
            self._ttft.observe(now_s - t.queued_s)
            n = req.num_prompt_tokens
            external = n - 1 if req.is_remote_prefill else 0
            cached = t.num_cached_tokens
            self.child(PROMPT_TOKENS).inc(n)
            self.child(PROMPT_TOKENS_BY_SOURCE, source="local_compute").inc(n - cached - external)
            self.child(PROMPT_TOKENS_BY_SOURCE, source="local_cache_hit").inc(cached)
            self.child(PROMPT_TOKENS_BY_SOURCE, source="external_kv_transfer").inc(external)
        elif t.last_token_s is not None:
            self._itl.observe(now_s - t.last_token_s)
        self._gen.inc()

    def on_request_finished(self, req: Request, reason: str) -> None:
        """`req` ended (its times complete): per-request histograms, as vLLM records them at finish."""
        t = req.times
        assert t.finished_s is not None
        n_out = len(req.output_token_ids)
        self.child(REQUEST_SUCCESS, finished_reason=reason).inc()
        self.child(E2E).observe(t.finished_s - t.queued_s)
        self.child(REQUEST_PROMPT_TOKENS).observe(req.num_prompt_tokens)
        self.child(REQUEST_GENERATION_TOKENS).observe(n_out)
        self.child(REQUEST_MAX_TOKENS).observe(req.max_tokens)
        self.child(REQUEST_MAX_GENERATION_TOKENS).observe(n_out)
        if t.scheduled_s is not None:
            self.child(QUEUE_TIME).observe(t.scheduled_s - t.queued_s)
            external = req.num_prompt_tokens - 1 if req.is_remote_prefill else 0
            computed = req.num_prompt_tokens - t.num_cached_tokens - external
            self.child(REQUEST_PREFILL_KV_COMPUTED).observe(computed)
        if t.first_token_s is not None and t.last_token_s is not None:
            if t.scheduled_s is not None:
                self.child(PREFILL_TIME).observe(t.first_token_s - t.scheduled_s)
                self.child(INFERENCE_TIME).observe(t.last_token_s - t.scheduled_s)
            self.child(DECODE_TIME).observe(t.last_token_s - t.first_token_s)
            if n_out > 1:
                self.child(TPOT).observe((t.last_token_s - t.first_token_s) / (n_out - 1))

    def on_kv_transfer_done(self, plan: TransferPlan, num_blocks: int, overrun_s: float) -> None:
        """Decode side, pull mode: the prompt KV arrived. Descriptors: one per block, layer, K and V."""
        xfer_s = plan.done_s - plan.start_s
        self.child(NIXL_XFER_TIME).observe(xfer_s)
        self.child(NIXL_POST_TIME).observe(plan.time.overhead_s)
        self.child(NIXL_BYTES).observe(plan.kv_bytes)
        self.child(NIXL_DESCRIPTORS).observe(num_blocks * self._num_layers * 2)
        self.child(KV_HANDOFF, link=self._link).observe(xfer_s)
        if overrun_s > 0:
            self.child(LAGGED_KV_TRANSFERS).inc()
            self._overrun(overrun_s)

    def on_kv_transfer_failed(self) -> None:
        self.child(NIXL_FAILED_TRANSFERS).inc()

    def on_kv_notification_failed(self) -> None:
        """The prefill side could not be told to release the KV (it died)."""
        self.child(NIXL_FAILED_NOTIFICATIONS).inc()

    def on_kv_expired(self, num_requests: int) -> None:
        """Prefill side: held KV released because no decode engine pulled it in time."""
        self.child(NIXL_KV_EXPIRED).inc(num_requests)

    def _overrun(self, overrun_s: float) -> None:
        self._max_overrun_s = max(self._max_overrun_s, overrun_s)
        self.child(MAX_OVERRUN).set(self._max_overrun_s)


def _num_layers(cfg: TestbedConfig) -> int:
    from cluster.profiles import MODELS

    return MODELS[cfg.target.model].num_layers


class ProxyMetrics(_Registry):
    """The client's view: latency through every role, the worst stall, SLO attainment and goodput."""

    def __init__(self, cfg: TestbedConfig, replica: int = 0) -> None:
        from workloads.slo import parse_slo

        super().__init__(PROXY_SERIES, _labels(cfg, "proxy", replica), cfg.scheduler.max_model_len)
        self._slos = [parse_slo(s) for s in cfg.slos]
        for reason in FINISHED_REASONS:
            self.child(REQUESTS_FINISHED, finished_reason=reason)
        for slo in self._slos:
            self.child(SLO_MET, slo=slo.name)
        self.child(TIME_SCALE).set(cfg.clock.scale if cfg.clock.mode == "live" else 1.0)
        self._worst_gap_s = 0.0

    def on_request_done(self, result: RequestResult) -> None:
        """The proxy finished `result` (any outcome); the same figures as its row of the results table."""
        from workloads.results import request_latencies

        lat = request_latencies(result.arrival_s, result.token_times_s)
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


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # no line per scrape
        pass


def serve_metrics(registry: CollectorRegistry, host: str) -> int:
    """Serve `registry` at http://host:PORT/metrics from a daemon thread; returns the free PORT chosen.

    Always in the classic text format: prometheus_client's OpenMetrics answer (which Prometheus 2.x asks
    for) escapes the ':' of `vllm:` names to '_' unless the scraper allows UTF-8, renaming every series.
    """
    app = make_wsgi_app(registry)

    def text_format(environ: dict, start_response: Any) -> Any:
        return app({**environ, "HTTP_ACCEPT": "text/plain"}, start_response)

    server = make_server(host, 0, text_format, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return int(server.server_port)


class RenderMetrics(_Registry):
    """A render replica's series; `on_render` is the Render role's hook."""

    def __init__(self, cfg: TestbedConfig, replica: int) -> None:
        super().__init__(RENDER_SERIES, _labels(cfg, "render", replica), cfg.scheduler.max_model_len)
        for op in ("render", "derender"):
            for spec in RENDER_SERIES:
                self.child(spec, op=op)

    def on_render(self, op: str, cpu_s: float, num_tokens: int) -> None:
        """One render (op='render') or derender (op='derender') call took `cpu_s` of this thread's CPU."""
        self.child(RENDER_CPU, op=op).inc(cpu_s)
        self.child(RENDER_TOKENS, op=op).inc(num_tokens)
        self.child(RENDER_CALLS, op=op).inc()


def merged_exposition(registries: list[CollectorRegistry]) -> str:
    """One exposition of several actors' registries in one process (families merged by name, as a
    scrape of one port must list each family once)."""
    merged: dict[str, Any] = {}
    for registry in registries:
        for family in registry.collect():
            if family.name in merged:
                merged[family.name].samples.extend(family.samples)
            else:
                merged[family.name] = family

    class _Merged:
        def collect(self) -> Any:
            return iter(merged.values())

    out = CollectorRegistry(auto_describe=False)
    out.register(_Merged())  # type: ignore[arg-type]
    return generate_latest(out).decode()


def sum_series(expositions: list[str], name: str, **match: str) -> float:
    """Sum of the samples named `name` (with labels matching `match`) over several expositions."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for text in expositions:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in match.items()):
                    total += s.value
    return total
