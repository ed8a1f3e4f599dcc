"""The run's summary as typed records: one per concern, each written by one function, merged into the
one record `testbed run`, `replay` and every point of a sweep write (`summary.json`, a sweep's row).

TypedDicts, not dataclasses: the record is the run's JSON and the sweep's row, read back from files by
the report and the planner, and averaged over seeds key by key (`summary.mean_records`); as a dict it is
that JSON, and mypy still checks every key a reader names and every value a writer gives.

    RunSummary ─┬─ design, rate, time_scale, cpu_overhead_share, trust    (cluster.outcome.run_output)
                ├─ ServeFigures: vLLM bench serve's keys and ours, of the results table (summary.summarize)
                ├─ LagFigures, FaultFigures, MoeFigures: of the engines' reports (summary.*_summary)
                ├─ EncoderFigures, MeasuredFigures: E/P/D's encoders, the measured time model (if any)
                ├─ TraceFigures, LoadFigures, TargetFigures: what the workload says of itself (if any)
                └─ DeploymentFigures: what the deployment says of itself (if any)
"""

# (no postponed annotations: TypedDict reads NotRequired at run time, which tests check)
from typing import Any, Literal, NotRequired, TypedDict


class HandoffFigures(TypedDict):
    """P/D: the handoff's time, and each of its parts' (`messages.latency.HANDOFF_PARTS`, in order:
    a test holds them together), in ms."""

    median_handoff_ms: float | None
    p99_handoff_ms: float | None
    median_handoff_proxy_hop_ms: float | None
    p99_handoff_proxy_hop_ms: float | None
    median_handoff_admission_wait_ms: float | None
    p99_handoff_admission_wait_ms: float | None
    median_handoff_link_queue_ms: float | None
    p99_handoff_link_queue_ms: float | None
    median_handoff_wire_ms: float | None
    p99_handoff_wire_ms: float | None
    median_handoff_fixed_ms: float | None
    p99_handoff_fixed_ms: float | None
    median_handoff_notice_wait_ms: float | None
    p99_handoff_notice_wait_ms: float | None
    median_handoff_first_step_ms: float | None
    p99_handoff_first_step_ms: float | None


class HandoffBytes(TypedDict):
    """P/D: what the handoffs moved (`summary.handoff_bytes`)."""

    num_handoffs: int
    mean_kv_bytes_per_handoff: float | None
    mean_state_bytes_per_handoff: float | None
    state_share_of_handoff_bytes: float | None


class SloFigures(TypedDict):
    """Per SLO set, by its name (`summary.slo_figures`)."""

    slo_attainment: dict[str, float]
    goodput: dict[str, float]
    slo_term_counts: dict[str, dict[str, dict[str, Any]]]
    """Each term's `TermCount` as JSON."""


class ServeFigures(HandoffFigures, HandoffBytes, SloFigures):
    """Of the results table, warm-ups left out (`summary.summarize`): vLLM bench serve's keys (ms,
    req/s, tok/s) and the testbed's own."""

    completed: int
    failed: int
    rejected: int
    """completed + failed + rejected: every request sent but warm-ups."""
    duration_s: float
    request_throughput: float
    output_throughput: float
    num_gpus: int | None
    output_throughput_per_gpu: float | None
    mean_ttft_ms: float | None
    median_ttft_ms: float | None
    p99_ttft_ms: float | None
    mean_itl_ms: float | None
    median_itl_ms: float | None
    p99_itl_ms: float | None
    mean_tpot_ms: float | None
    median_tpot_ms: float | None
    p99_tpot_ms: float | None
    median_e2el_ms: float | None
    p99_e2el_ms: float | None
    max_gap_ms: float | None
    median_render_ms: float | None
    median_encode_ms: float | None
    median_ec_transfer_ms: float | None
    num_preemptions: int
    num_prefill_retries: int
    num_prefill_timeouts: int
    prefix_hit_rate: float
    prompt_token_share_by_source: dict[str, float]
    median_ttft_ms_by_turn: dict[str, float | None]


class LagFigures(TypedDict):
    """Over all engines (`summary.lag_summary`)."""

    lag_fraction: float
    max_overrun_ms: float
    num_engines_lost: int


class FaultFigures(TypedDict):
    """Over all engines (`summary.fault_summary`)."""

    num_failed_loads: int
    num_injected_load_failures: int
    num_recomputed_loads: int
    num_engines_hung: int


class MoeFigures(TypedDict):
    """A MoE target's steps per engine role (`summary.moe_summary`; empty for a dense one)."""

    moe_steps_by_role: dict[str, dict[str, float]]


class EncoderFigures(TypedDict, total=False):
    """E/P/D: the encoder pool (`outcome.encoder_summary`)."""

    encoder_busy_fraction: float
    encoder_cache_hit_rate: float


class MeasuredFigures(TypedDict, total=False):
    """`target.time_model: measured` (`outcome.measured_summary`)."""

    measured_share_by_role: dict[str, float]
    kernel_tables_by_role: dict[str, str]
    measured_coverage: str


class TraceFigures(TypedDict, total=False):
    """A replayed trace (`replay.workload_info`)."""

    trace: str
    num_sessions: int
    theoretical_prefix_hit_rate: float | None
    """An infinite cache's (None: a trace of chat prompts, not known before rendering)."""
    theoretical_prefix_hit_rate_with_answers: float | None


class LoadFigures(TypedDict, total=False):
    """How the load is sent, where not the default (`replay.load_info`)."""

    max_concurrency: int
    num_warmup_requests: int


class TargetFigures(TypedDict, total=False):
    """Replayed against a server (`replay --target`)."""

    target: str
    model: str


class WorkloadInfo(TraceFigures, LoadFigures, TargetFigures, total=False):
    """What the workload says of itself: its rate where it has one of its own (a trace's nominal rate,
    a closed loop's inf), overriding `workload.rate`."""

    rate: float


class DeploymentFigures(TypedDict, total=False):
    """What the deployment says of itself (virtual and live: proxy restarts; live: its clocks)."""

    num_proxy_restarts: int
    clock_sync: dict[str, dict[str, float]]
    """Per node: its clock's uncertainty and wall skew (ms; `clock_sync.sync_summary`)."""


class RunSummary(
    ServeFigures,
    LagFigures,
    FaultFigures,
    MoeFigures,
    EncoderFigures,
    MeasuredFigures,
    TraceFigures,
    LoadFigures,
    TargetFigures,
    DeploymentFigures,
):
    """The run's record (`summary.json`; a sweep's row adds `seed`)."""

    design: str
    rate: float
    """Requests a second: `workload.rate`, or the workload's own (`WorkloadInfo`)."""
    time_scale: float | Literal["auto"]
    """The live clock's (`clock.time_scale`; resolved before a live run)."""
    cpu_overhead_share: float
    trust: NotRequired[str]
    """An emulated target's: how far the held-out silicon rows say to trust its figures."""
    interrupted: NotRequired[bool]
    """Ctrl-C: the partial results of the requests that finished."""
