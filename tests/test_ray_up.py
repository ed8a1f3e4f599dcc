"""The `ray up` cluster files validate against Ray's cluster schema, and fit the local provider's rules."""

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT.parent / "shared" / "reference" / "ray-schema.json"
FILES = [ROOT / "cluster" / "ray-up" / name for name in ("aws.yaml", "onprem.yaml")]  # each must exist
LOCAL_FORBIDDEN = {"available_node_types", "head_node_type", "head_node", "worker_nodes"}


@pytest.fixture(scope="module")
def schema():
    if not SCHEMA.exists():
        pytest.skip(f"{SCHEMA} is not beside this checkout")
    return json.loads(SCHEMA.read_text())


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_validates_against_ray_schema(path, schema):
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_pool_resources_and_token_auth(path):
    cfg = yaml.safe_load(path.read_text())
    text = path.read_text()
    for pool in ("mixed", "prefill", "decode"):
        assert pool in text
    assert all("RAY_AUTH_MODE=token" in c for c in cfg["head_start_ray_commands"] if "ray " in c)
    assert any("testbed dashboards up" in c for c in cfg["head_start_ray_commands"])
    assert any("make setup" in c for c in cfg["setup_commands"])
    # What a `ray up` over SSH found missing (tests/test_ray_up_cluster.py): `ray down`'s bare `ray stop`
    # needs the venv on the login PATH; Prometheus comes through the Makefile (root or sudo, its service off).
    assert any("disagg-testbed venv" in c and ".bashrc" in c for c in cfg["setup_commands"])
    assert any("make prometheus" in c for c in cfg["head_setup_commands"])
    assert all("--autoscaling-config" in c for c in cfg["head_start_ray_commands"] if "ray start" in c)


def test_local_provider_has_no_node_types():
    cfg = yaml.safe_load((ROOT / "cluster" / "ray-up" / "onprem.yaml").read_text())
    assert cfg["provider"]["type"] == "local"
    assert not LOCAL_FORBIDDEN & set(cfg)
    assert all("--resources" in c for c in cfg["worker_start_ray_commands"] if "ray start" in c)


def test_aws_node_types_map_gpus_to_pool_resources():
    cfg = yaml.safe_load((ROOT / "cluster" / "ray-up" / "aws.yaml").read_text())
    types = cfg["available_node_types"]
    assert types["l40s"]["node_config"]["InstanceType"].startswith("g6e")
    assert types["h100"]["node_config"]["InstanceType"].startswith("p5")
    for name in ("l40s", "h100"):
        assert {"mixed", "prefill", "decode"} <= set(types[name]["resources"])


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_ray_prepares_and_validates_it_as_ray_up_would(path):
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(yaml.safe_load(path.read_text())))


def test_follow_head_runs_its_command_once_the_head_stops_answering(tmp_path):
    """`follow-head.sh HOST:PORT CMD`: nothing while something answers there, CMD once nothing does (how a
    worker's Ray and the head's Prometheus leave with `ray down`, which stops only the head's Ray)."""
    import socket
    import subprocess
    import time

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    done = tmp_path / "done"
    script = ROOT / "cluster" / "ray-up" / "follow-head.sh"
    proc = subprocess.Popen([str(script), f"127.0.0.1:{port}", "touch", str(done)])
    try:
        time.sleep(3)
        assert not done.exists() and proc.poll() is None
        # One missed connection is not the head going away (three running are).
        listener.close()
        time.sleep(2.5)
        listener = socket.create_server(("127.0.0.1", port))
        time.sleep(4)
        assert not done.exists() and proc.poll() is None
        listener.close()
        proc.wait(timeout=15)
        assert proc.returncode == 0 and done.exists()
    finally:
        listener.close()
        proc.kill()
