"""A process that used a ``vm://NAME`` URI leaves no broker data directory behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

CHILD = """
import os, sys
import amqtransport
with amqtransport.connect("vm://exitleak") as conn:
    conn.send("/queue/exit", "bye")
    print("DIRS", sorted(n for n in os.listdir(sys.argv[1]) if n.startswith("amq-broker-")), flush=True)
"""


def test_a_process_that_used_a_vm_uri_removes_its_broker_dir_at_exit(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, TMPDIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == 0, done.stderr
    # while connected, the broker's private data dir was there (in the child's TMPDIR)
    assert "DIRS ['amq-broker-exitleak-" in done.stdout, done.stdout + done.stderr
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("amq-broker-")] == []
