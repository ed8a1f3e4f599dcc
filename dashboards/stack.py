"""`testbed dashboards up|down`: a local Prometheus (and Grafana, if installed) watching the testbed.

    live run ──writes──► metrics.sd_file (one target per actor) ◄──file SD── Prometheus ◄── Grafana
                                                                              (provisioned: datasource
                                                                               + dashboards/grafana/*.json)

Both run detached from the command, with their state (config, TSDB, logs, pids) in one directory, and
bind 127.0.0.1 unless told otherwise. `up` is idempotent: a stack already running is reported, not doubled.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from emulation.config import MetricsConfig

SHIPPED_CONFIG = Path(__file__).parent / "prometheus.yml"
GRAFANA_DIR = Path(__file__).parent / "grafana"
_READY_TIMEOUT_S = 30.0


class StackError(RuntimeError):
    pass


@dataclass(frozen=True)
class Stack:
    prometheus_url: str
    grafana_url: str | None
    """None when no Grafana is installed."""
    state_dir: Path


def default_state_dir() -> Path:
    cache = os.environ.get("TESTBED_CACHE") or Path.home() / ".cache" / "disagg-testbed"
    return Path(cache) / "dashboards"


def prometheus_config(sd_file: str, scrape_interval: str) -> str:
    """The shipped scrape config with this host's target file and interval."""
    cfg = yaml.safe_load(SHIPPED_CONFIG.read_text())
    cfg["global"]["scrape_interval"] = cfg["global"]["evaluation_interval"] = scrape_interval
    for job in cfg["scrape_configs"]:
        if job["job_name"] == "disagg-testbed":
            path = Path(sd_file)  # a live run's targets, and `testbed serve`'s beside them
            files = [sd_file, str(path.with_name(f"{path.stem}-*{path.suffix}"))]
            job["file_sd_configs"] = [{"files": files, "refresh_interval": "1s"}]
    return yaml.safe_dump(cfg, sort_keys=False)


def up(
    host: str = "127.0.0.1",
    port: int = 9090,
    grafana_port: int = 3000,
    scrape_interval: str = "5s",
    sd_file: str = MetricsConfig.sd_file,
    state_dir: Path | None = None,
) -> Stack:
    """Start Prometheus (and Grafana when `grafana-server` is on PATH) unless already running."""
    state = state_dir or default_state_dir()
    state.mkdir(parents=True, exist_ok=True)
    prom_url = f"http://{host}:{port}"
    if _alive(state / "prometheus.pid"):
        prom_url = (state / "prometheus.url").read_text()  # the running one's, whatever was asked now
    else:
        binary = shutil.which("prometheus")
        if binary is None:
            raise StackError(
                "prometheus: not found on PATH; install it (Debian/Ubuntu: apt-get install prometheus)"
            )
        Path(sd_file).parent.mkdir(parents=True, exist_ok=True)
        if not Path(sd_file).exists():
            Path(sd_file).write_text("[]\n")
        (state / "prometheus.yml").write_text(prometheus_config(sd_file, scrape_interval))
        _spawn(
            "prometheus",
            [
                binary,
                f"--config.file={state / 'prometheus.yml'}",
                f"--storage.tsdb.path={state / 'prometheus-data'}",
                f"--web.listen-address={host}:{port}",
            ],
            state,
            {},
        )
        _wait_ready(f"{prom_url}/-/ready", state / "prometheus.log")
        (state / "prometheus.url").write_text(prom_url)
    grafana_url = _grafana(host, grafana_port, prom_url, state)
    return Stack(prom_url, grafana_url, state)


def _grafana(host: str, port: int, prom_url: str, state: Path) -> str | None:
    binary = shutil.which("grafana-server") or shutil.which("grafana")
    if binary is None:
        return None
    url = f"http://{host}:{port}"
    if _alive(state / "grafana.pid"):
        return (state / "grafana.url").read_text()
    home = next(
        (p for p in (Path("/usr/share/grafana"), Path(binary).parents[1]) if (p / "conf").exists()), None
    )
    args = [binary, "server"] if Path(binary).name == "grafana" else [binary]
    if home is not None:
        args.append(f"--homepath={home}")
    env = {
        "GF_SERVER_HTTP_ADDR": host,
        "GF_SERVER_HTTP_PORT": str(port),
        "GF_PATHS_DATA": str(state / "grafana-data"),
        "GF_PATHS_LOGS": str(state),
        "GF_PATHS_PROVISIONING": str(GRAFANA_DIR / "provisioning"),
        "GF_AUTH_ANONYMOUS_ENABLED": "true",
        "TESTBED_PROMETHEUS_URL": prom_url,
        "TESTBED_DASHBOARDS_DIR": str(GRAFANA_DIR),
    }
    _spawn("grafana", args, state, env)
    _wait_ready(f"{url}/api/health", state / "grafana.log")
    (state / "grafana.url").write_text(url)
    return url


def down(state_dir: Path | None = None) -> list[str]:
    """Stop what `up` started; returns the names of what was stopped."""
    state = state_dir or default_state_dir()
    stopped = []
    for name in ("grafana", "prometheus"):
        pid_file = state / f"{name}.pid"
        if _alive(pid_file):
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if not _pid_alive(pid):
                    break
                time.sleep(0.1)
            stopped.append(name)
        pid_file.unlink(missing_ok=True)
    return stopped


def _spawn(name: str, args: list[str], state: Path, env: dict[str, str]) -> None:
    with open(state / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives this command; `down` stops it
            env={**os.environ, **env},
        )
    (state / f"{name}.pid").write_text(str(proc.pid))


def _wait_ready(url: str, log: Path) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
    raise StackError(f"{url}: not ready after {_READY_TIMEOUT_S:.0f} s; log {log}:\n{tail}")


def _alive(pid_file: Path) -> bool:
    return pid_file.exists() and _pid_alive(int(pid_file.read_text() or 0))


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # a zombie (exited child of this process) still answers kill(0)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True
