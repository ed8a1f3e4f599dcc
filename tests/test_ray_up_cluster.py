"""`ray up` for real: the on-prem cluster file launches a three-node cluster over SSH on this host, a
job runs on it, Prometheus on the head scrapes its actors, its run directory comes back, and
`ray down` leaves nothing running.

One host plays every node: an SSH server of the test's own (a throwaway key, loopback addresses only)
answers at 127.0.0.1 (head), 127.0.0.2 (prefill) and 127.0.0.3 (decode); a third worker's address,
127.0.0.9, answers nothing (a typo'd address), and the wait for it must end naming it. The test's copy of
`cluster/ray-up/onprem.yaml` changes what a user would (addresses, SSH user and key, the project path:
this checkout) and what sharing one host needs: no `ray stop` before a worker starts (it would stop
every node here), and ports and a temp dir of each worker's own.

Part of `make test` (root only: port 22); marked `cluster` so that `make test-cluster` runs it alone.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RAY = str(ROOT / ".venv" / "bin" / "ray")
HEAD, PREFILL, DECODE = "127.0.0.1", "127.0.0.2", "127.0.0.3"
NUM_REQUESTS = 12
OWN_PORTS = ("node-manager", "object-manager", "dashboard-agent-listen", "dashboard-agent-grpc",
             "metrics-export", "runtime-env-agent")  # fmt: skip
FOLLOWERS = f"follow-head.sh {HEAD}:6379"
"""The cluster's `follow-head.sh` processes (not another test's, following a port of its own)."""
LEFTOVERS = ("raylet", "gcs_server", "/usr/bin/prometheus", FOLLOWERS)
"""What `ray down` must leave no process of."""

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.full,
    pytest.mark.skipif(
        os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists(),
        reason="needs root (an SSH server on port 22 of 127.0.0.1-3) and openssh-server (make ssh-tools)",
    ),
]


def run(*cmd: str, timeout: float, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`cmd` with Ray's token auth, its output kept; a failure or a hang ends the test with both."""
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{' '.join(cmd[:3])} did not end within {timeout:g} s: {e.stdout!r}") from None
    if check and out.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd[:3])} failed ({out.returncode}): {out.stdout[-3000:]}{out.stderr[-3000:]}"
        )
    return out


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """An SSH server on port 22 of 127.0.0.1-3 taking a throwaway key; stopped, and its files removed."""
    taken = [ip for ip in (HEAD, PREFILL, DECODE) if _answers(ip, 22)]
    assert not taken, (
        f"port 22 already answers at {taken} (a system SSH server?): the test needs port 22 of "
        f"{HEAD}-3 for an SSH server of its own (Ray's autoscaler reaches workers on port 22 only)"
    )
    d = tmp_path_factory.mktemp("sshd")
    for name in ("key", "host_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    shutil.copy(d / "key.pub", d / "authorized_keys")
    listen = "".join(f"ListenAddress {ip}\n" for ip in (HEAD, PREFILL, DECODE))
    (d / "sshd_config").write_text(
        f"Port 22\n{listen}HostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n"
        f"PidFile {d}/sshd.pid\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 10
    while not _answers(DECODE, 22):
        assert proc.poll() is None, (
            f"sshd did not start: {proc.stderr.read().decode() if proc.stderr else ''}"
        )
        assert time.monotonic() < deadline, "sshd does not answer on 127.0.0.3:22"
        time.sleep(0.1)
    yield d / "key"
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(d)
    deadline = time.monotonic() + 30  # its sessions end once Ray's SSH connections stop persisting (10 s)
    while subprocess.run(["pgrep", "-f", "^sshd: "], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "SSH sessions of the test left running"
        time.sleep(1)


def _answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


def cluster_file(tmp: Path, key: Path, workers: tuple[str, ...]) -> Path:
    """The test's copy of onprem.yaml: this checkout on these addresses (see the module's docstring)."""
    text = (ROOT / "cluster" / "ray-up" / "onprem.yaml").read_text()
    text = text.replace("~/disagg-testbed", str(ROOT)).replace("10.0.0.11", workers[0])
    cfg = yaml.safe_load(text.replace("--object-store-memory=2000000000", "--object-store-memory=200000000"))
    cfg["cluster_name"] = f"testbed-e2e-{os.getpid()}"
    cfg["provider"].update(head_ip=HEAD, worker_ips=list(workers))
    cfg["max_workers"] = len(workers)
    cfg["auth"] = {"ssh_user": getpass.getuser(), "ssh_private_key": str(key)}
    cfg["file_mounts"] = {str(ROOT): str(ROOT)}
    # Each worker gets ports and a temp dir of its own: the workers start at once, and two nodes in one
    # temp dir pick the same plasma store socket name (each takes the first name not yet on disk).
    own = " ".join(f"--{p}-port=$((30000 + 10 * ${{NODE_IP##*.}} + {k}))" for k, p in enumerate(OWN_PORTS))
    own += " --temp-dir=/tmp/ray/node-${NODE_IP##*.}"
    cfg["worker_start_ray_commands"] = [
        c.replace("--resources=", f"{own} --resources=")
        for c in cfg["worker_start_ray_commands"]
        if not c.rstrip().endswith("ray stop")
    ]
    path = tmp / "onprem-e2e.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


BOGUS = "127.0.0.9"
"""A worker address nothing answers at (the test's SSH server listens on 127.0.0.1-3 only)."""
BOGUS_WAIT_S = 30
"""How long the test waits for it. The head's autoscaler starts every worker's update (the address's
status `waiting-for-ssh`, kept while its SSH retries go on: 900 s) at its first pass, seconds after
`ray up` returns; a worker that answers has joined 20 s after that on two busy cores."""


@pytest.fixture(scope="module")
def cluster(sshd, tmp_path_factory):
    """`ray up` of the test's cluster file, with a prefill and a decode worker and one at BOGUS (a
    typo'd address, say); its path. After the module's tests, `ray down` and a check that nothing is
    left, pass or fail (the login shell's ~/.bashrc, which the cluster file's setup extends, is
    restored)."""
    running = _leftovers()
    assert not running, f"Ray or Prometheus already runs on this host (ray up would stop it): {running}"
    bashrc = Path.home() / ".bashrc"
    saved = bashrc.read_text() if bashrc.exists() else None
    path = cluster_file(tmp_path_factory.mktemp("cluster"), sshd, (PREFILL, DECODE, BOGUS))
    name = yaml.safe_load(path.read_text())["cluster_name"]
    try:
        up = run(RAY, "up", "-y", "-v", "--no-config-cache", str(path), timeout=600)
        steps = [line for line in up.stdout.splitlines() if line.startswith("20") and "INFO" in line]
        print(*steps, sep="\n")  # ray up's steps with their times, shown with a failure
        yield path
    finally:
        run(RAY, "down", "-y", str(path), timeout=180, check=False)
        deadline = time.monotonic() + 30
        while (left := _leftovers()) and time.monotonic() < deadline:
            time.sleep(1)
        run(RAY, "stop", "--force", timeout=60, check=False)  # (so that a failure here leaves nothing)
        subprocess.run(["pkill", "-f", "/usr/bin/prometheus"], check=False)
        subprocess.run(["pkill", "-f", FOLLOWERS], check=False)
        # Ray's files of this cluster: the head's copy of its config, the local provider's node states,
        # the CLI's cache of its resolved config.
        for leftover in [*Path.home().glob("ray_bootstrap_*"), *Path("/tmp/ray").glob(f"cluster-{name}.*")]:
            leftover.unlink()
        for cached in Path(tempfile.gettempdir()).glob("ray-config-*"):
            if f'"{name}"' in cached.read_text():
                cached.unlink()
        if saved is not None:
            bashrc.write_text(saved)
        assert not left, f"left running after ray down: {left}"


def _leftovers() -> list[str]:
    out = subprocess.run(["pgrep", "-af", "|".join(LEFTOVERS)], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def wait_for_workers(
    path: Path, workers: tuple[str, ...], join_timeout_s: float
) -> dict[str, dict[str, float]]:
    """Wait for every worker of `workers` to join; each node's resources by address. A worker that has
    not joined in `join_timeout_s` ends the test with its address and what the head says of it."""
    deadline = time.monotonic() + join_timeout_s
    while True:
        nodes = dict(_nodes())
        if not (missing := sorted(set(workers) - set(nodes))):
            return nodes
        if time.monotonic() > deadline:
            # What the head's autoscaler says of them, asked as a user would from here.
            status = run(RAY, "exec", str(path), "RAY_AUTH_MODE=token ray status", timeout=120, check=False)
            said = [line.strip() for line in status.stdout.splitlines() if any(h in line for h in missing)]
            raise AssertionError(f"worker(s) {missing} never joined the cluster; ray status: {said}")
        time.sleep(5)


def _nodes() -> list[tuple[str, dict[str, float]]]:
    script = (
        "import json, ray; ray.init(address='auto', logging_level='ERROR');"
        "nodes = [(n['NodeManagerAddress'], n['Resources']) for n in ray.nodes() if n['Alive']];"
        "print('NODES', json.dumps(nodes))"
    )
    out = run(str(ROOT / ".venv" / "bin" / "python"), "-c", script, timeout=60, check=False)
    found = [line for line in out.stdout.splitlines() if line.startswith("NODES ")]  # (Ray prints too)
    return json.loads(found[0].removeprefix("NODES ")) if found else []


def _prometheus(query: str) -> list[dict]:
    url = f"http://{HEAD}:9090/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())["data"]["result"]


def test_a_worker_nobody_answers_at_ends_the_wait_in_bounded_time_naming_it(cluster):
    """(First: its wait is also the other workers' time to join.)"""
    started = time.monotonic()
    with pytest.raises(AssertionError) as failed:
        wait_for_workers(cluster, (PREFILL, DECODE, BOGUS), join_timeout_s=BOGUS_WAIT_S)
    assert "never joined the cluster" in str(failed.value) and f"'{BOGUS}'" in str(failed.value)
    assert f"{BOGUS}: local.cluster.node, waiting-for-ssh" in str(failed.value)  # the reason, from the head
    assert time.monotonic() - started < BOGUS_WAIT_S + 120  # the wait, then ray status


def test_ray_up_runs_a_live_job_across_three_nodes_and_ray_down_leaves_nothing(cluster, tmp_path):
    nodes = wait_for_workers(cluster, (PREFILL, DECODE), join_timeout_s=240)
    assert nodes[PREFILL].get("prefill") == 4 and nodes[DECODE].get("decode") == 4

    run_dir = f"/tmp/testbed-e2e-run-{os.getpid()}"
    testbed = ROOT / ".venv" / "bin" / "testbed"
    command = (
        f"{testbed} run --mode live --address auto --time-scale auto --design pd-fast --compute skip "
        f"--num-requests {NUM_REQUESTS} --rate 2 --out {run_dir}"
    )
    submitted = time.time()
    try:
        run(RAY, "job", "submit", f"--address=http://{HEAD}:8265", "--", "bash", "-c", command, timeout=600)
        # Prometheus on the head scraped the engines, each pool's on its own node (this job's samples
        # only: its storage outlives clusters).
        window_s = int(time.time() - submitted) + 5
        ttft = _prometheus(f"max_over_time(vllm:time_to_first_token_seconds_count[{window_s}s])")
        engines = {r["metric"]["actor"]: r["metric"]["instance"].split(":")[0] for r in ttft}
        assert engines == {"prefill-0": PREFILL, "decode-0": DECODE}, ttft
        assert {float(r["value"][1]) for r in ttft} == {NUM_REQUESTS}
        # The run directory comes back whole.
        back = tmp_path / "back"
        run(RAY, "rsync-down", str(cluster), f"{run_dir}/", f"{back}/", timeout=120)
        df = pd.read_parquet(back / "results.parquet")
        assert len(df) == NUM_REQUESTS and df["ok"].all() and df["request_id"].is_unique
        assert (back / "summary.json").exists() and (back / "report.html").exists()
        resolved = yaml.safe_load((back / "configs" / "pd-fast.yaml").read_text())
        assert isinstance(resolved["clock"]["time_scale"], float)  # auto, resolved (where: test_live)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
