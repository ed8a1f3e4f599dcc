"""The checked-in Grafana boards are what the code generates, and name only the metrics module's series."""

import json
import re

import pytest
import yaml

from dashboards import grafana
from dashboards import metrics as m


@pytest.mark.parametrize("board", list(grafana.BOARDS))
def test_checked_in_board_is_generated(board):
    on_disk = (grafana.OUT_DIR / f"{board}.json").read_text()
    assert on_disk == grafana.render(board), "regenerate with: python -m dashboards.grafana"
    parsed = json.loads(on_disk)
    assert parsed["uid"] == f"testbed-{board}"
    assert all(
        p["datasource"]["uid"] == grafana.DATASOURCE.uid for p in parsed["panels"] if p["type"] != "row"
    )


def test_boards_name_only_series_of_the_metrics_module():
    known = set()
    for spec in m.ALL_SERIES:
        known |= {spec.exposed, spec.bucket, spec.sum, spec.count}
    used = set()
    for board in grafana.BOARDS:
        for expr in grafana.expressions(grafana.render(board)):
            used |= set(re.findall(r"\b((?:vllm|testbed):[a-z0-9_]+)", expr))
    assert used and used <= known, used - known
    overview = grafana.expressions(grafana.render("overview"))
    for spec in (m.CLIENT_TTFT, m.ITL, m.CLIENT_E2E, m.WORST_GAP, m.KV_CACHE_USAGE, m.SLO_MET):
        assert any(spec.name in e for e in overview), spec.name


def test_provisioning_points_at_the_boards_and_datasource():
    root = grafana.OUT_DIR / "provisioning"
    ds = yaml.safe_load((root / "datasources" / "testbed.yaml").read_text())["datasources"][0]
    assert ds["uid"] == grafana.DATASOURCE.uid and ds["type"] == "prometheus"
    provider = yaml.safe_load((root / "dashboards" / "testbed.yaml").read_text())["providers"][0]
    assert provider["type"] == "file" and "TESTBED_DASHBOARDS_DIR" in provider["options"]["path"]
