"""ruff and mypy run as part of the suite, so the README test command gates on them.

mypy's configuration (strict on the pure layers: stomp, uri, options, backoff, destinations, errors)
lives in pyproject.toml; the file list here is the typed public surface.
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


def test_mypy_is_clean_on_the_typed_layers() -> None:
    targets = ["amqtransport/errors.py", "amqtransport/stomp"]
    targets += [t for t in ("amqtransport/uri.py", "amqtransport/options.py", "amqtransport/backoff.py", "amqtransport/destinations.py") if (ROOT / t).exists()]
    result = subprocess.run(
        [_tool("mypy"), *targets],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
