"""ruff and mypy run as part of the suite, so the README test command gates on them.

mypy's configuration lives in pyproject.toml ``[tool.mypy]``: strict for the whole project
(``files``: the package, bridge/, chaos/, examples/, benchmarks/), as ``make lint`` runs it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed in this environment (pip install -e '.[dev]')")
    return found


def test_ruff_is_clean() -> None:
    result = subprocess.run(
        [_tool("ruff"), "check", "amqtransport", "bridge", "chaos", "tests", "benchmarks", "examples"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean_on_the_whole_project() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert config.get("strict") is True, "mypy runs strict for the whole project"
    assert {"amqtransport", "bridge", "chaos"} <= set(config["files"])
    result = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
