"""`testbed plan`: percentile SLO targets in the configs' grammar, the search against an exhaustive
one on reduced spaces (the guide's designs x chunk sizes x rates; WEKA sessions under routers x P:D
ratios), the recommended YAML run as it is, the answer to a target no candidate meets, and bad
input."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pandas as pd
import pytest
import yaml

from cluster.cli import main
from cluster.config_load import load_designs
from cluster.plan.floors import floors_s, prefill_floor_s
from cluster.plan.search import Probe, Search
from cluster.plan.space import Candidate
from workloads.slo import DEFAULT_PERCENTILE, SloError, parse_slo
from workloads.slo_targets import parse_slo_target, percentile_s

from .factories import TRACES, cli_process


def _results(ttft: list[float], ok: list[bool] | None = None) -> pd.DataFrame:
    ok = ok if ok is not None else [True] * len(ttft)
    times = [[t, t + 0.02, t + 0.05] for t in ttft]
    return pd.DataFrame(
        {
            "ok": ok,
            "ttft_s": ttft,
            "tpot_s": [0.025] * len(ttft),
            "e2el_s": [t + 0.05 for t in ttft],
            "max_gap_s": [0.03] * len(ttft),
            "token_times_s": times,
            "p99_itl_s": [0.03] * len(ttft),
            "handoff_s": [0.0] * len(ttft),
            "num_output_tokens": [3] * len(ttft),
        }
    )


# -- SLO targets ----------------------------------------------------------------------------------


def test_a_targets_percentile_counts_failed_requests_as_infinitely_late():
    df = _results([float(i) for i in range(1, 11)])  # TTFT 1..10 s
    assert percentile_s(df, "ttft", 90) == 9.0 and percentile_s(df, "ttft", 100) == 10.0
    assert percentile_s(df, "itl", 50) == pytest.approx(0.02)  # pooled gaps: 0.02 and 0.03
    target = parse_slo_target("ttft:p90<=9s,tpot:p50<=30ms")
    assert target.met(df)
    failed = _results([float(i) for i in range(1, 11)], ok=[True] * 8 + [False] * 2)
    assert percentile_s(failed, "ttft", 90) == math.inf and not target.met(failed)
    assert target.ratios(df) == {"ttft:p90": 1.0, "tpot:p50": pytest.approx(25 / 30)}
    assert target.attainment(df) == 0.9 and target.attainment(failed) == 0.8  # ttft 10 s over 9 s


def test_one_grammar_for_configs_and_targets_a_term_without_a_percentile_bounds_the_p90():
    """`ttft<=2s` is `ttft:p90<=2s` in `--slo` and in configs (`testbed run` and `sweep` judge a config's
    set as a target: tests/test_slo_percentiles.py); a one-term p90 target holds exactly when 90 % of
    requests are within its bound, the per-request share (`attainment`) a summary reports."""
    plain, explicit = (
        parse_slo_target("ttft<=2s, tpot<=50ms"),
        parse_slo_target("ttft:p90<=2s,tpot:p90<=50ms"),
    )
    assert plain.terms == explicit.terms and plain.name == "ttft<=2s,tpot<=50ms"
    assert plain.label == explicit.label == "TTFT p90 ≤ 2 s and TPOT p90 ≤ 50 ms"
    assert parse_slo("ttft:p90<=2s,tpot<=50ms").terms == plain.terms  # configs parse the same terms
    assert parse_slo_target("itl:p99.9<=1500ms").label == "ITL p99.9 ≤ 1.5 s"
    assert parse_slo("ttft<=2s").terms[0].percentile == DEFAULT_PERCENTILE
    df = _results([float(i) for i in range(1, 11)])  # TTFT 1..10 s
    for bound, met in (("9s", True), ("8.5s", False)):
        target = parse_slo_target(f"ttft<={bound}")
        assert target.met(df) is met and (target.attainment(df) >= 0.9) is met
    # a config takes a percentile too, and reports its SLO set as written
    cfg = load_designs("guide-l40s", ["collocated"], ['slos=["ttft:p99<=2s,tpot<=30ms"]'])[0]
    assert cfg.slos == ("ttft:p99<=2s,tpot<=30ms",)


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("ttft<2s", ["'ttft<2s'", "metric[:pNN]<=NUMBER(ms|s)", "ttft<=2s (its p90)", "ttft:p99<=2s"]),
        ("ttft:90<=2s", ["'ttft:90<=2s'", "metric[:pNN]<=NUMBER(ms|s)"]),
        ("ttfb:p90<=2s", ["'ttfb'", "allowed: ttft, tpot, itl, gap, e2el"]),
        ("ttft:p0<=2s", ["p0", "(0, 100]"]),
        ("ttft:p90<=0s", ["0s", "> 0"]),
    ],
)
def test_a_bad_target_is_one_line_naming_it(text, needles):
    with pytest.raises(SloError) as e:
        parse_slo_target(text)
    assert "\n" not in str(e.value) and str(e.value).startswith("--slo:")
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))


# -- the search's logic, on made-up probes ----------------------------------------------------------


class _TableSearch(Search):
    """A Search whose replays are looked up in a table of TTFTs (candidate, load index) -> seconds,
    so that the bisection and the halving can be checked against every possible answer."""

    table: dict[tuple[int, int], float]
    num_probes = 0

    def ensure(self, keys):
        for c, li, s in keys:
            if (c, li, s) not in self.runs:
                self.num_probes += 1
                self.runs[(c, li, s)] = Probe(_results([self.table[(c, li)] + 0.01 * s] * 4), {}, 1.0)


def _table_search(num_candidates: int, num_loads: int, rng: random.Random) -> _TableSearch:
    cfg = load_designs("guide-l40s", ["collocated"])[0]
    cands = [Candidate(f"c{i}", cfg) for i in range(num_candidates)]
    search = _TableSearch(cands, [0.1 * (i + 1) for i in range(num_loads)], [0, 1, 2])
    search.table = {}
    for c in range(num_candidates):  # TTFT grows with load: the target (<= 1 s) holds up to a knee
        knee = rng.randint(-1, num_loads - 1)
        for li in range(num_loads):
            search.table[(c, li)] = 0.5 if li <= knee else 2.0
    return search


def test_bisection_finds_what_replaying_every_load_finds_in_logarithmic_probes():
    rng = random.Random(7)
    target = parse_slo_target("ttft:p90<=1s")
    for num_loads in (1, 2, 5, 8, 13):
        search = _table_search(6, num_loads, rng)
        found = search.bisect(target, range(6), (0,), {})
        assert search.num_probes <= 6 * math.ceil(math.log2(num_loads + 1))
        assert {c: lo for c, (lo, hi) in found.items()} == search.exhaustive(target, range(6))
        assert all(hi == lo + 1 for lo, hi in found.values())


def test_halving_keeps_the_best_and_gives_it_every_seed():
    target = parse_slo_target("ttft:p90<=1s")
    search = _table_search(8, 10, random.Random(3))
    outcomes = search.halving(target, range(8), lambda c, g: float(g))
    best = max(outcomes, key=lambda c: outcomes[c].goodput_index)
    assert outcomes[best].seeds == (0, 1, 2) and outcomes[best].dropped is None
    exhaustive = search.exhaustive(target, range(8))
    assert outcomes[best].goodput_index == max(exhaustive.values())
    assert sum(o.dropped is not None for o in outcomes.values()) >= 4


def test_branch_and_bound_stops_only_those_that_cannot_be_best():
    """Scores per GPU differ by candidate (c + 1 GPUs): many stop with brackets open, some to the grid's
    top; the best by score is the exhaustive search's best."""
    target = parse_slo_target("ttft:p90<=1s")
    for seed in range(5):
        search = _table_search(8, 10, random.Random(seed))

        def score(c, g, search=search):
            return search.loads[g] / (c + 1) if g >= 0 else -1.0

        outcomes = search.halving(target, range(8), score)
        exhaustive = search.exhaustive(target, range(8))
        best = max(outcomes, key=lambda c: (score(c, outcomes[c].goodput_index), -c))
        assert score(best, outcomes[best].goodput_index) == max(score(c, g) for c, g in exhaustive.items())
        assert outcomes[best].dropped is None and outcomes[best].goodput_index == exhaustive[best]


# -- shapes ----------------------------------------------------------------------------------------


def test_auto_shapes_fill_the_budget_with_each_designs_kind():
    from cluster.plan.shapes import parse_shapes, shapes_for
    from cluster.plan.space import build_space

    first = load_designs("guide-l40s", ["collocated", "pd-fast"])
    shapes = {c.design: shapes_for(c, parse_shapes("auto", 4), 4) for c in first}
    cands, left_out = build_space("guide-l40s", ["collocated", "pd-fast"], [], [], 4, shapes)
    names = [c.name for c in cands]
    assert names[:4] == [f"collocated c{n}" for n in range(1, 5)]
    assert sorted(names[4:]) == sorted(
        f"pd-fast p{p}d{d}" for p in range(1, 4) for d in range(1, 4) if p + d <= 4
    )
    assert all(c.num_gpus <= 4 for c in cands) and not left_out
    pd = next(c for c in cands if c.name == "pd-fast p1d3")
    assert pd.cfg.kv_transfer.link == "rdma-400g" and pd.ray_units == {"prefill": 1, "decode": 3}
    listed = {c.design: shapes_for(c, parse_shapes("c2,p2d2", None), None) for c in first}
    assert [label for label, _ in listed["collocated"]] == ["c2"] and [lb for lb, _ in listed["pd-fast"]] == [
        "p2d2"
    ]


# -- floors -----------------------------------------------------------------------------------------


def test_floors_are_the_prompt_alone_in_chunks_and_a_lone_decode():
    cfg = load_designs("guide-l40s", ["pd-fast"])[0]
    floors = floors_s(cfg)
    assert floors is not None
    one_chunk = prefill_floor_s(cfg, cfg.pools.prefill, 2048)
    # four 2,048-token chunks, each attending to those before it: more than four first chunks
    assert floors["ttft"] > 4 * one_chunk
    assert floors["tpot"] == floors["itl"] == floors["gap"] > 0
    assert floors["e2el"] == pytest.approx(floors["ttft"] + 255 * floors["tpot"])
    weka = f"replay.trace={TRACES / 'weka_claude_code'}"
    trace = load_designs("agentic-h200", ["pd"], [weka])[0]
    assert floors_s(trace) is None  # a trace's floors depend on its prefix hits


# -- the command, on real replays -------------------------------------------------------------------

GUIDE = ["plan", "--preset", "guide-l40s", "--num-requests", "24", "--seeds", "3", "--jobs", "2"]
GUIDE += ["--loads", ",".join(f"{0.4 * i:.1f}" for i in range(1, 17))]  # 0.4 to 6.4 req/s
GUIDE += ["--vary", "scheduler.max_num_batched_tokens=1024,4096"]


def _plan(tmp_path, argv, name):
    out = tmp_path / name
    assert main([*argv, "--out", str(out)]) == 0
    return json.loads((out / "plan.json").read_text()), out


def _plan_in_a_process(tmp_path, argv, name):
    """`_plan` as `testbed plan` in a process of its own (`factories.cli_process`: its replays'
    worker processes fork, as a user's do); plan.json, the run directory and what it printed."""
    out = tmp_path / name
    printed = cli_process(*argv, "--out", str(out))
    return json.loads((out / "plan.json").read_text()), out, printed


def test_plan_picks_what_an_exhaustive_sweep_picks_with_a_fifth_of_the_replays(tmp_path):
    plan, out, text = _plan_in_a_process(tmp_path, GUIDE, "plan")
    ref, _, _ = _plan_in_a_process(tmp_path, [*GUIDE, "--exhaustive"], "exhaustive")
    top, ref_top = plan["targets"][0]["rows"][0], ref["targets"][0]["rows"][0]
    assert top["candidate"] == ref_top["candidate"]
    loads = plan["loads"]
    assert abs(loads.index(top["goodput_load"]) - loads.index(ref_top["goodput_load"])) <= 1
    assert ref["num_runs"] == ref["num_runs_exhaustive"] == 6 * 16 * 3
    assert plan["num_runs"] * 5 <= ref["num_runs"]
    assert "Recommended: " + top["candidate"] in text and "What binds" in text
    for f in ["candidates.csv", "results.parquet", "plots/pareto_tokens.png", "plots/goodput_cost.png"]:
        assert (out / f).stat().st_size > 0, f
    assert len(list((out / "configs").glob("*.yaml"))) == 6
    assert plan["recommended_ray_units"] == {"mixed": 2}  # collocated: two engines of one GPU
    assert "Recommended: " in (out / "report.html").read_text()
    # the recommended design runs as written, at the load the plan found
    cfg = yaml.safe_load((out / "recommended.yaml").read_text())
    assert cfg["workload"]["rate"] == top["goodput_load"]
    run = tmp_path / "run"
    assert main(["run", "--config", str(out / "recommended.yaml"), "--out", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary[0]["completed"] == 24


@pytest.mark.full  # ~40 s: 64 replays of agentic sessions
@pytest.mark.parallel  # replays in virtual time: no port, no wall-clock time
def test_plan_over_weka_sessions_picks_what_an_exhaustive_sweep_picks(tmp_path):
    argv = ["plan", "--preset", "agentic-h200", "--trace", str(TRACES / "weka_claude_code")]
    argv += ["--set", "replay.max_turns=3", "--design", "pd", "--seeds", "1", "--jobs", "2"]
    argv += ["--slo", "ttft:p90<=1500ms,itl:p99<=60ms", "--loads", "1,2,4,8,16,32,64"]
    argv += ["--vary", "router.policy=round_robin,kv_aware"]
    argv += ["--vary", "pools.prefill.replicas=1,2", "--vary", "pools.decode.replicas=1,2"]
    plan, _, _ = _plan_in_a_process(tmp_path, argv, "plan")
    ref, _, _ = _plan_in_a_process(tmp_path, [*argv, "--exhaustive"], "exhaustive")
    top, ref_top = plan["targets"][0]["rows"][0], ref["targets"][0]["rows"][0]
    assert top["candidate"] == ref_top["candidate"]
    assert plan["num_runs"] < ref["num_runs"] == 8 * 7


def test_a_target_no_candidate_meets_is_answered_with_the_floor(tmp_path, capsys):
    argv = ["plan", "--preset", "guide-l40s", "--num-requests", "24", "--seeds", "1", "--loads", "0.2,0.4"]
    argv += ["--slo", "ttft:p90<=300ms,tpot:p90<=50ms"]
    plan, out = _plan(tmp_path, argv, "plan")
    lines = plan["targets"][0]["explanation"]
    assert lines[0].startswith("No candidate meets TTFT p90 ≤ 300 ms and TPOT p90 ≤ 50 ms at any load")
    ttft = next(line for line in lines[1:] if line.startswith("No candidate meets TTFT p90 ≤ 300 ms"))
    assert "the floor is" in ttft and "8192-token prompt's prefill alone" in ttft
    assert "Closest candidates" in lines[-1] or any(
        "floor:" in str(r["dropped"]) for r in plan["targets"][0]["rows"]
    )
    assert not (out / "recommended.yaml").exists()
    assert all(r["goodput_load"] is None for r in plan["targets"][0]["rows"])


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (["--slo", "ttft<2s"], ["--slo:", "'ttft<2s'", "metric[:pNN]<=NUMBER(ms|s)"]),
        (["--slo", "ttft:p101<=2s"], ["--slo:", "p101", "(0, 100]"]),
        (["--set", "slos=[ttft:p0<=2s]"], ["slos:", "p0", "(0, 100]"]),
        (["--preset", "deepseek-v3-h800", "--rank", "cost"], ["--rank cost", "'h800'", "--price h800=USD"]),
        (["--price", "h100=2"], ["--price", "'h100'", "allowed:"]),
        (["--max-gpus", "1"], ["search space: empty", "over --max-gpus 1"]),
        (
            ["--vary", "pools.mixed.replicas=0,2", "--design", "collocated"],
            ["=0: no design takes it", "pools"],
        ),
        (["--vary", "scheduler.nope=1,2"], ["scheduler.nope", "is not a field", "allowed at scheduler"]),
        (["--jobs", "0"], ["--jobs=0", ">= 1"]),
        (["--rank", "cost", "--price", "l40s=inf"], ["--price", "'l40s=inf'", "> 0"]),
        (["--loads", "0.4,0.2"], ["--loads='0.4,0.2'", "ascending"]),
        (["--vary", "nope:scheduler.block_size=16"], ["--vary", "'nope'", "collocated"]),
        (["--shapes", "auto"], ["--shapes auto", "--max-gpus"]),
        (["--shapes", "c2,x3"], ["--shapes", "'x3'", "allowed: cN", "pPdD"]),
    ],
)
def test_bad_plan_input_is_one_line(tmp_path, capsys, extra, needles):
    assert main(["plan", *extra, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


def test_frontier_keeps_only_points_no_other_beats_on_both_axes():
    from dashboards.plan_plots import frontier

    pts = pd.DataFrame({"tps_per_user": [10, 20, 30, 15], "tps_per_gpu": [100, 80, 40, 60]})
    assert frontier(pts)["tps_per_user"].tolist() == [10, 20, 30]
    assert np.all(np.diff(frontier(pts)["tps_per_gpu"]) < 0)


@pytest.mark.full  # a local Ray: ~40 s
def test_the_recommended_design_runs_live_on_a_local_ray(tmp_path):
    argv = ["plan", "--preset", "guide-l40s", "--design", "collocated,pd-fast", "--num-requests", "16"]
    plan, out, _ = _plan_in_a_process(tmp_path, [*argv, "--seeds", "1", "--loads", "0.4,0.8,1.2"], "plan")
    live = tmp_path / "live"
    run = ["run", "--config", str(out / "recommended.yaml"), "--mode", "live", "--num-requests", "4"]
    assert main([*run, "--compute", "skip", "--time-scale", "1", "--out", str(live)]) == 0
    summary = json.loads((live / "summary.json").read_text())[0]
    assert (
        summary["completed"] == 4
        and summary["design"] == plan["targets"][0]["rows"][0]["candidate"].split()[0]
    )


def test_the_same_seed_gives_the_same_plan(tmp_path):
    argv = ["plan", "--preset", "guide-l40s", "--num-requests", "16", "--seeds", "2"]
    argv += ["--loads", "0.4,0.8,1.6"]
    first, _, _ = _plan_in_a_process(tmp_path, argv, "a")
    second, _, _ = _plan_in_a_process(tmp_path, argv, "b")
    assert first["targets"] == second["targets"] and first["num_runs"] == second["num_runs"]


def test_plan_takes_a_term_without_a_percentile_as_its_p90_and_says_so(tmp_path, capsys):
    argv = ["plan", "--preset", "guide-l40s", "--design", "collocated", "--num-requests", "16"]
    argv += ["--seeds", "1", "--loads", "0.4,0.8,1.6"]
    plain, _ = _plan(tmp_path, [*argv, "--slo", "ttft<=2s,tpot<=50ms"], "plain")
    explicit, _ = _plan(tmp_path, [*argv, "--slo", "ttft:p90<=2s,tpot:p90<=50ms"], "explicit")
    assert plain["targets"][0]["target"] == "ttft<=2s,tpot<=50ms"
    assert plain["targets"][0]["rows"] == explicit["targets"][0]["rows"]
    assert plain["targets"][0]["explanation"] == explicit["targets"][0]["explanation"]
    assert main(["plan", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "a term without a percentile bounds the p90 (ttft<=2s is ttft:p90<=2s)" in help_text
