"""The client core reads its options as typed fields: no ``Any`` and no
``getattr(options, name, default)`` in the transports and the client layer (a
misspelt option name would otherwise fall back to its default silently)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import amqtransport

ROOT = Path(amqtransport.__file__).parent
CORE = sorted([ROOT / "client.py", *(ROOT / "transports").glob("*.py")])


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "Any":
            out.append(f"{path.name}:{node.lineno}: Any")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                and node.args and "option" in ast.unparse(node.args[0])):
            out.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return out


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_core_module_reads_typed_options(path: Path) -> None:
    assert _offences(path) == []


def test_the_check_finds_what_it_forbids(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from typing import Any\nx: Any = getattr(options, 'timeout', -1)\n")
    assert len(_offences(bad)) == 2
