"""Lint, type checks, the import-layer contracts and size limits run as tests, so CI fails on them."""

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.full,  # ruff, mypy, import-linter (also `make lint`): not `make test-fast`
    pytest.mark.parallel,  # each tool reads the tree and writes its cache in this checkout alone
]

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed; `make test` installs it")
    return found


@pytest.mark.parametrize(
    "cmd",
    [["ruff", "check", "."], ["ruff", "format", "--check", "."], ["mypy"], ["lint-imports"]],
    ids=["ruff-check", "ruff-format", "mypy", "import-contracts"],
)
def test_static_checks(cmd):
    proc = subprocess.run([_tool(cmd[0]), *cmd[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_import_contracts_catch_an_upward_import(tmp_path):
    """The layer contracts are not vacuous: a copy of the tree whose bottom layer imports a
    composition root breaks them."""
    for package in ("emulation", "messages", "workloads", "actors", "dashboards", "cluster"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    roofline = tmp_path / "emulation" / "roofline.py"
    roofline.write_text(roofline.read_text() + "\nimport cluster.virtual  # noqa\n")
    env = {"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(tmp_path)}
    cmd = [_tool("lint-imports"), "--no-cache"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode != 0, proc.stdout
    assert "emulation.roofline -> cluster.virtual" in proc.stdout


MAX_FUNCTION_LINES, MAX_CLASS_LINES = 80, 400
"""Alarms, not targets. Aim for functions of ~50 lines and classes of one concept (often ~200 lines);
past 80 a function does more than one thing, and past 400 a class is several concepts. A class is
never cut to meet a number: its methods stay in it, lines are not packed, and a concept leaves only
for a class of its own (docs/development.md)."""


def test_no_function_or_class_is_too_long():
    too_long = []
    for package in ("emulation", "messages", "workloads", "actors", "dashboards", "cluster"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                limit = MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
                if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    num_lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if num_lines > limit:
                        too_long.append(
                            f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {num_lines} lines"
                        )
    assert not too_long, "\n".join(too_long)
