"""What a newcomer is shown runs as shown: the README front page's commands, the help against the docs,
and the package's runtime dependencies alone enough to import every module."""

from __future__ import annotations

import importlib.metadata
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from cluster.cli import build_parser
from cluster.config_load import preset_designs

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PACKAGES = ("emulation", "messages", "workloads", "actors", "dashboards", "cluster")

pytestmark = pytest.mark.parallel  # its `full` tests: virtual runs and imports in processes of their own


def front_page_commands() -> list[str]:
    """Every `testbed ...` line of the README's ```bash blocks (servers are shown in ```text blocks)."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.startswith("testbed ")]


def test_the_front_page_is_short_and_shows_its_commands():
    assert len(README.read_text().splitlines()) <= 200
    commands = front_page_commands()
    assert len(commands) >= 5 and any(c.startswith("testbed replay") for c in commands), commands


@pytest.mark.full
@pytest.mark.parametrize("command", front_page_commands())
def test_each_front_page_command_runs_as_written(command, tmp_path):
    """From the project's root, as a user pastes it (its run directory moved to a temporary one), in the
    time the README gives it: a minute, on this 2-core machine."""
    argv = shlex.split(command)
    if argv[1] != "presets":
        argv += ["--out", str(tmp_path / "out")]
    exe = Path(sys.executable).parent / "testbed"
    proc = subprocess.run([str(exe), *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    if argv[1] != "presets":
        assert (tmp_path / "out" / "report.html").exists() and (tmp_path / "out" / "results.parquet").exists()


def _choices(command: str, flag: str) -> list[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]  # type: ignore[union-attr, index]
    return list(next(a for a in sub._actions if flag in a.option_strings).choices)


def test_the_help_and_the_docs_name_the_same_formats_presets_and_designs():
    formats = _choices("replay", "--format")
    line = re.search(r"chosen by `--format` \((.*?)\)", (ROOT / "docs" / "replay.md").read_text(), re.S)
    assert line is not None
    assert re.findall(r"`([a-z-]+)`", line.group(1)) == formats
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    presets = preset_designs()
    for name, (_, designs) in presets.items():
        entry = re.search(rf"^- `{name}`:(.*?)(?=^- |^#)", configuration, re.S | re.M)
        assert entry is not None, name
        assert all(f"`{d}`" in entry.group(1) for d in designs), (name, designs)
    out = subprocess.run(
        [str(Path(sys.executable).parent / "testbed"), "presets"], capture_output=True, text=True, timeout=60
    ).stdout
    assert all(name in out for name in presets)


def _runtime_distributions() -> set[str]:
    """The project's runtime requirements and theirs, recursively (extras as asked, markers evaluated)."""
    seen: set[str] = set()
    todo = [(Requirement(r), ()) for r in importlib.metadata.requires("disagg-testbed") or []]
    todo = [(r, ()) for r, _ in todo if r.marker is None or r.marker.evaluate({"extra": ""})]
    while todo:
        req, _ = todo.pop()
        name = req.name.lower().replace("_", "-")
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        dist = importlib.metadata.distribution(req.name)
        for text in dist.requires or []:
            sub = Requirement(text)
            wanted = [{"extra": e} for e in req.extras] or [{"extra": ""}]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in wanted):
                todo.append((sub, ()))
    return {k.split("[")[0] for k in seen}


@pytest.mark.full
def test_every_module_imports_with_only_the_runtime_dependencies(tmp_path):
    """A site of links to just the runtime distributions' files (no dev extra: pytest, openai, ...), and
    a Python that sees only it, the standard library and the project: every module imports."""
    site = tmp_path / "site"
    site.mkdir()
    for name in _runtime_distributions():
        dist = importlib.metadata.distribution(name)
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (site / top).exists() and not top.endswith(".pth"):
                (site / top).symlink_to(source)
    modules = [
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for package in PACKAGES
        for p in sorted((ROOT / package).rglob("*.py"))
    ]
    script = (
        "import importlib, sys\n"
        f"sys.path[:0] = [{str(site)!r}, {str(ROOT)!r}]\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
    )
    proc = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
