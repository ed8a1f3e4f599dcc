"""The Grafana dashboards, generated from code with grafana-foundation-sdk; `python -m dashboards.grafana`
rewrites the checked-in JSON under `dashboards/grafana/` (a test keeps the two identical).

Four boards: an overview (the client's view and the engines' state), the P/D handoff, one row per
role (then render, the encoder and MoE targets' experts: `grafana_encoder.py`, `grafana_moe.py`),
and replayed sessions with their routing (`grafana_sessions.py`). Every expression names its series
through `dashboards.metrics` (helpers: `grafana_panels.py`). Counters are rated per wall second
by Prometheus; throughput panels multiply by `testbed:time_scale` to show per *emulated* second.
"""

from __future__ import annotations

import json
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import VariableRefresh

from dashboards import metrics as m
from dashboards.grafana_encoder import encoder_panels
from dashboards.grafana_moe import moe_panels
from dashboards.grafana_panels import DATASOURCE, PER_SIM_S, ROLE, mean, panel, quantile, rate, sel
from dashboards.grafana_sessions import sessions_panels

OUT_DIR = Path(__file__).parent / "grafana"
VARIABLES = ("model_name", "design", "role")


def _variable(name: str, query: str) -> dashboard.QueryVariable:
    return (
        dashboard.QueryVariable(name)
        .label(name)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


def _board(uid: str, title: str, desc: str) -> dashboard.Dashboard:
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(desc)
        .tags(["disagg-testbed", "vllm"])
        .refresh("5s")
        .time("now-15m", "now")
        .with_variable(_variable("model_name", f"label_values({m.NUM_REQUESTS_RUNNING.name}, model_name)"))
        .with_variable(_variable("design", f"label_values({m.TIME_SCALE.name}, design)"))
    )


def overview() -> dashboard.Dashboard:
    board = _board(
        "testbed-overview", "disagg-testbed: overview", "The client's view and the engines' state."
    )
    return _rows(
        board,
        (dashboard.Row("Client (through the proxy, every role)"), _client_panels()),
        (dashboard.Row("Engines"), _engine_panels()),
    )


def _client_panels() -> list[timeseries.Panel]:
    qs = (0.5, 0.9, 0.99)
    return [
        panel(
            "Request rate",
            "reqps",
            "Finished requests per emulated second, by how they ended.",
            (rate(m.REQUESTS_FINISHED, "finished_reason") + PER_SIM_S, "{{finished_reason}}"),
        ),
        panel(
            "Goodput and SLO attainment",
            "reqps",
            "Requests per emulated second meeting each SLO set; attainment is the share of all.",
            (rate(m.SLO_MET, "slo") + PER_SIM_S, "goodput {{slo}}"),
            (f"{rate(m.SLO_MET, 'slo')} / scalar({rate(m.REQUESTS_FINISHED)})", "attainment {{slo}}"),
        ),
        panel(
            "Time to first token (client)",
            "s",
            "From the client's send to its first token, through prefill, handoff and decode.",
            *[(quantile(q, m.CLIENT_TTFT), f"p{round(q * 100)}") for q in qs],
            (mean(m.CLIENT_TTFT), "mean"),
        ),
        panel(
            "End-to-end latency (client)",
            "s",
            "From the client's send to its last token.",
            *[(quantile(q, m.CLIENT_E2E), f"p{round(q * 100)}") for q in qs],
        ),
        panel(
            "Inter-token latency and the worst stall",
            "s",
            "Engines' ITL quantiles; each request's worst gap (p99); the worst gap so far.",
            *[(quantile(q, m.ITL, "role"), f"ITL p{round(q * 100)} {{{{role}}}}") for q in (0.5, 0.99)],
            (quantile(0.99, m.MAX_GAP), "per-request worst gap p99"),
            (f"max({m.WORST_GAP.name}{sel()})", "worst gap so far"),
        ),
        panel(
            "Time to first token (engines)",
            "s",
            "vLLM's engine-level TTFT: from the request reaching the engine (decode: after the handoff).",
            *[(quantile(q, m.TTFT, "role"), f"p{round(q * 100)} {{{{role}}}}") for q in (0.5, 0.99)],
        ),
    ]


def _engine_panels() -> list[timeseries.Panel]:
    return [
        panel(
            "Running and waiting requests",
            "none",
            "Requests in batches and in queues (waiting includes those waiting for remote KV).",
            (f"sum by (role) ({m.NUM_REQUESTS_RUNNING.name}{sel()})", "running {{role}}"),
            (f"sum by (role) ({m.NUM_REQUESTS_WAITING.name}{sel()})", "waiting {{role}}"),
        ),
        panel(
            "KV cache usage",
            "percentunit",
            "Share of KV blocks in use, per engine.",
            (f"max by (role, replica) ({m.KV_CACHE_USAGE.name}{sel()})", "{{role}}-{{replica}}"),
        ),
        panel(
            "Token throughput",
            "short",
            "Prompt and generated tokens per emulated second.",
            (rate(m.PROMPT_TOKENS, "role") + PER_SIM_S, "prompt {{role}}"),
            (rate(m.GENERATION_TOKENS, "role") + PER_SIM_S, "generation {{role}}"),
        ),
        panel(
            "Prefix cache hit rate",
            "percentunit",
            "Prompt tokens found in the prefix cache over tokens looked up.",
            (f"{rate(m.PREFIX_CACHE_HITS, 'role')} / {rate(m.PREFIX_CACHE_QUERIES, 'role')}", "{{role}}"),
        ),
    ]


def handoff() -> dashboard.Dashboard:
    board = _board(
        "testbed-handoff", "disagg-testbed: P/D handoff", "KV handoff from prefill to decode, and lag."
    )
    return _with_panels(board, _handoff_panels())


def _handoff_panels() -> list[timeseries.Panel]:  # a table of panels, not logic
    per_transfer = rate(m.NIXL_BYTES.count)
    state = f"({rate(m.KV_TRANSFER_STATE_BYTES.sum)} or vector(0))"  # (only hybrid targets' engines have it)
    return [
        panel(
            "KV transfer time",
            "s",
            "NIXL transfer duration (decode side); the testbed's handoff time by link.",
            *[(quantile(q, m.NIXL_XFER_TIME), f"xfer p{round(q * 100)}") for q in (0.5, 0.99)],
            (quantile(0.99, m.KV_HANDOFF, "link, direction"), "handoff p99 {{link}} {{direction}}"),
            (mean(m.KV_HANDOFF, "link, direction"), "handoff mean {{link}} {{direction}}"),
        ),
        panel(
            "KV bytes",
            "bytes",
            "Bytes per transfer, and bytes moved per emulated second.",
            (mean(m.NIXL_BYTES), "bytes per transfer"),
            (rate(m.NIXL_BYTES.sum) + PER_SIM_S, "bytes per second"),
        ),
        panel(
            "SSM state beside KV (hybrid targets)",
            "bytes",
            "Per handoff, the attention KV (grows with the prompt) and a hybrid target's SSM state (a fixed "
            "size a request; 0 without SSM layers) that NIXL moved together: short prompts move more state.",
            (f"({rate(m.NIXL_BYTES.sum)} - {state}) / {per_transfer}", "KV"),
            (f"{state} / {per_transfer}", "SSM state"),
        ),
        panel(
            "Effective bandwidth",
            "Bps",
            "Bytes moved over the time spent moving them (queueing on a shared link included).",
            (f"{rate(m.NIXL_BYTES.sum)} / {rate(m.NIXL_XFER_TIME.sum)}", "effective"),
        ),
        panel(
            "Post time and descriptors",
            "s",
            "Fixed costs of posting a transfer; descriptors per transfer (block x layer x K/V).",
            (quantile(0.99, m.NIXL_POST_TIME), "post p99"),
            (mean(m.NIXL_DESCRIPTORS), "descriptors per transfer"),
        ),
        panel(
            "Failures",
            "short",
            "Failed pulls, failed release notifications, prefill KV expired unpulled (per emulated s).",
            (rate(m.NIXL_FAILED_TRANSFERS) + PER_SIM_S, "failed transfers"),
            (rate(m.NIXL_FAILED_NOTIFICATIONS) + PER_SIM_S, "failed notifications"),
            (rate(m.NIXL_KV_EXPIRED) + PER_SIM_S, "expired KV"),
        ),
        panel(
            "Handoff, itemised (median)",
            "s",
            "From prefill's token to decode's first, part by part (they add up): proxy hop, admission wait, "
            "link queue, wire, fixed costs, notice wait, first decode step.",
            (quantile(0.5, m.KV_HANDOFF_PARTS, "part"), "{{part}}"),
        ),
        panel(
            "KV held for a pull",
            "short",
            "Blocks of finished requests held for a pull, per replica: prefill's until decode's completion "
            "notice; decode's (bidirectional) for a conversation's next turn; and pull backs that found "
            "them gone and recomputed.",
            (f"max by (replica) ({m.KV_HELD_BLOCKS.name}{sel(role='prefill')})", "prefill-{{replica}}"),
            (
                f"max by (replica) ({m.KV_CONVERSATION_BLOCKS.name}{sel(role='decode')})",
                "decode-{{replica}}: conversations (bidirectional)",
            ),
            (rate(m.KV_PULL_BACK_FAILED) + PER_SIM_S, "pull backs recomputed per s"),
        ),
        panel(
            "Lag",
            "percentunit",
            "Share of steps and KV pulls whose real work overran the emulated time (keep below 1 %).",
            (f"{rate(m.LAGGED_STEPS, 'role')} / {rate(m.STEPS, 'role')}", "steps {{role}}"),
            (f"{rate(m.LAGGED_KV_TRANSFERS)} / {rate(m.NIXL_XFER_TIME.count)}", "KV pulls"),
        ),
    ]


def roles() -> dashboard.Dashboard:
    board = _board("testbed-roles", "disagg-testbed: roles", "One row per role: load, batches, queues, KV.")
    board = board.with_variable(_variable("role", f"label_values({m.NUM_REQUESTS_RUNNING.name}, role)"))
    return _rows(
        board,
        (dashboard.Row("$role").repeat("role"), _role_panels()),
        (dashboard.Row("render (templates, detokenizing, parsing: CPU off the GPU box)"), _render_panels()),
        (dashboard.Row("encoder (E/P/D: the vision encoder on GPUs of its own)"), encoder_panels()),
        (dashboard.Row("MoE targets (expert load, EP imbalance, all-to-alls, AFD)"), moe_panels()),
    )


def _role_panels() -> list[timeseries.Panel]:  # a table of panels (61 lines), not logic
    return [
        panel(
            "Utilisation",
            "percentunit",
            "Emulated busy time per emulated second, per replica.",
            (rate(m.BUSY, "replica", **ROLE) + PER_SIM_S, "{{replica}}"),
            w=8,
        ),
        panel(
            "Tokens per step",
            "short",
            "Scheduled tokens per engine step (vLLM's iteration tokens).",
            *[(quantile(q, m.ITERATION_TOKENS, **ROLE), f"p{round(q * 100)}") for q in (0.5, 0.99)],
            w=8,
        ),
        panel(
            "Requests",
            "none",
            "Running and waiting requests, per replica.",
            (f"sum by (replica) ({m.NUM_REQUESTS_RUNNING.name}{sel(**ROLE)})", "running {{replica}}"),
            (f"sum by (replica) ({m.NUM_REQUESTS_WAITING.name}{sel(**ROLE)})", "waiting {{replica}}"),
            w=8,
        ),
        panel(
            "Request phases (p90)",
            "s",
            "Queue, prefill and decode time of requests on this role.",
            (quantile(0.9, m.QUEUE_TIME, **ROLE), "queue"),
            (quantile(0.9, m.PREFILL_TIME, **ROLE), "prefill"),
            (quantile(0.9, m.DECODE_TIME, **ROLE), "decode"),
        ),
        panel(
            "Prompt tokens by source",
            "short",
            "Computed here, found in the prefix cache, or received by KV transfer (per emulated s).",
            (rate(m.PROMPT_TOKENS_BY_SOURCE, "source", **ROLE) + PER_SIM_S, "{{source}}"),
        ),
        panel(
            "KV cache usage",
            "percentunit",
            "Share of KV blocks in use, per replica.",
            (f"max by (replica) ({m.KV_CACHE_USAGE.name}{sel(**ROLE)})", "{{replica}}"),
            w=8,
        ),
        panel(
            "Preemptions",
            "short",
            "Requests preempted (blocks freed, to be recomputed) per emulated second, per replica.",
            (rate(m.NUM_PREEMPTIONS, "replica", **ROLE) + PER_SIM_S, "{{replica}}"),
            w=8,
        ),
        panel(
            "CPU share of step time",
            "percentunit",
            "The CPU work on the steps' path (scheduling, inputs, sampling, outputs) over their time.",
            (f"{rate(m.STEP_CPU, 'replica', **ROLE)} / {rate(m.BUSY, 'replica', **ROLE)}", "{{replica}}"),
            w=8,
        ),
    ]


def _render_panels() -> list[timeseries.Panel]:
    return [
        panel(
            "Render CPU per 1k tokens",
            "ms",
            "CPU milliseconds per 1,000 tokens rendered (prompts) or derendered (outputs).",
            (f"1e6 * {rate(m.RENDER_CPU, 'op')} / {rate(m.RENDER_TOKENS, 'op')}", "{{op}}"),
        ),
        panel(
            "Render calls per replica",
            "reqps",
            "Render calls (one per request) and derender calls (one per chunk) per emulated second.",
            (rate(m.RENDER_CALLS, "op, replica") + PER_SIM_S, "{{op}} {{replica}}"),
        ),
    ]


def _rows(
    board: dashboard.Dashboard, *rows: tuple[dashboard.Row, list[timeseries.Panel]]
) -> dashboard.Dashboard:
    """`board` with each row followed by its panels."""
    for row, panels in rows:
        board = _with_panels(board.with_row(row), panels)
    return board


def _with_panels(board: dashboard.Dashboard, panels: list[timeseries.Panel]) -> dashboard.Dashboard:
    for p in panels:
        board = board.with_panel(p)
    return board


def sessions() -> dashboard.Dashboard:
    board = _board(
        "testbed-sessions",
        "disagg-testbed: sessions and routing",
        "Replayed multi-turn and agentic sessions: per-turn TTFT, prefix reuse, the routers' choices.",
    )
    return _with_panels(board, sessions_panels())


BOARDS = {"overview": overview, "handoff": handoff, "roles": roles, "sessions": sessions}


def render(name: str) -> str:
    """A board's JSON as checked in."""
    return json.dumps(BOARDS[name]().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def expressions(board_json: str) -> list[str]:
    """Every PromQL expression of a board (panels and variables)."""
    board = json.loads(board_json)
    exprs = [t["expr"] for p in board.get("panels", []) for t in p.get("targets", [])]
    return exprs + [v["query"] for v in board.get("templating", {}).get("list", [])]


def main() -> None:
    OUT_DIR.mkdir(exist_ok=True)
    for name in BOARDS:
        (OUT_DIR / f"{name}.json").write_text(render(name))
        print(f"wrote {OUT_DIR / name}.json")


if __name__ == "__main__":
    main()
