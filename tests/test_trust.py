"""How far a run says to trust it (emulation/trust.py): the held-out silicon rows nearest its target,
read from the errors the silicon bench wrote, or "not validated"; in every run's summary and report."""

from __future__ import annotations

import json

import pytest

from cluster.outcome import trust_for
from cluster.virtual import run_virtual
from emulation import trust
from emulation.profiles import GPUS, MODELS
from tests.factories import COLLOCATED, make_config


@pytest.fixture
def errors(tmp_path, monkeypatch):
    """A silicon_errors.json of two groups, read in place of the shipped one."""
    path = tmp_path / "silicon_errors.json"
    groups = [
        {"time_model": "measured", "gpu_family": "Hopper", "model_kind": "dense", "mode": "agg",
         "num_rows": 140, "ttft_mdape": 12.3, "tpot_mdape": 8.0, "ttft_bias": -10.0, "tpot_bias": 2.5},
        {"time_model": "operators", "gpu_family": "Blackwell", "model_kind": "moe", "mode": "disagg",
         "num_rows": 3, "ttft_mdape": 70.0, "tpot_mdape": 30.0, "ttft_bias": -70.0, "tpot_bias": -30.0},
    ]  # fmt: skip
    path.write_text(json.dumps({"split": "held-out", "groups": groups}))
    monkeypatch.setattr(trust, "SILICON_ERRORS", path)
    trust._errors.cache_clear()
    yield path
    trust._errors.cache_clear()


def test_a_target_gets_the_errors_of_the_rows_nearest_it(errors):
    t = trust.trust_of("measured", GPUS["h200"], MODELS["qwen2.5-7b"], disaggregated=False)
    assert (t.gpu_family, t.model_kind, t.mode, t.num_rows) == ("Hopper", "dense", "agg", 140)
    assert t.line == (
        "TTFT typically within ±12 % (median -10 %), TPOT within ±8 % (median +2 %) for dense on Hopper, "
        "aggregated, measured time model: 140 held-out silicon rows"
    )
    moe = trust.trust_of("operators", GPUS["b200"], MODELS["qwen3-30b-a3b"], disaggregated=True)
    assert moe.num_rows == 3 and "moe on Blackwell, disaggregated" in moe.line


def test_a_target_no_row_is_near_is_not_validated(errors):
    for t in (
        trust.trust_of("aggregate", GPUS["h200"], MODELS["qwen2.5-7b"], disaggregated=False),  # another model
        trust.trust_of("measured", GPUS["l40s"], MODELS["qwen2.5-7b"], disaggregated=False),  # Ada: no rows
        trust.trust_of("measured", GPUS["ascend-910c"], MODELS["deepseek-v3"], disaggregated=True),
    ):
        assert t.num_rows == 0 and t.line.startswith("not validated: no held-out silicon rows for ")
    assert trust.gpu_family(GPUS["ascend-910c"]) == "ascend-910c"
    assert trust.model_kind(MODELS["deepseek-v3"]) == "mla-moe"


def test_a_run_says_how_far_to_trust_it(errors):
    cfg = make_config(COLLOCATED, target={"time_model": "measured"}, pools={"mixed": {"gpu": "h100-sxm"}},
                      workload={"num_requests": 2, "prompt_len": 64, "output_len": 4})  # fmt: skip
    assert trust_for(cfg).num_rows == 140
    assert run_virtual(cfg).summary["trust"] == trust_for(cfg).line


def test_the_shipped_errors_are_the_held_out_rows_of_every_time_model():
    shipped = json.loads(trust.SILICON_ERRORS.read_text())
    assert shipped["split"] == "held-out"
    groups = shipped["groups"]
    assert {"aggregate", "operators", "measured"} <= {g["time_model"] for g in groups}
    assert all(g["num_rows"] > 0 and g["ttft_mdape"] >= 0 and g["tpot_mdape"] >= 0 for g in groups)
    assert {g["mode"] for g in groups} == {"agg", "disagg"}
