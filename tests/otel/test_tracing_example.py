"""examples/tracing.py as a person runs it: a replicated pair, a send across a frozen
then killed master, the consumer; it prints a trace tree in which the send is replayed
(with its events), and the consumer's process and ack spans sit under it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def test_the_example_prints_a_readable_trace_tree() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "tracing.py")], capture_output=True,
                         text=True, timeout=110)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("trace ")
    assert lines[1].startswith("└─ send /queue/orders  PRODUCER") and lines[1].endswith("replayed")
    body = "\n".join(lines[2:])
    assert "├─ event amqtransport.failover.interrupted  lost tcp://127.0.0.1:" in body
    assert "├─ event amqtransport.failover.reconnected  new tcp://127.0.0.1:" in body
    assert "├─ event amqtransport.send.replayed  tcp://127.0.0.1:" in body
    assert "   └─ process /queue/orders  CONSUMER" in body
    assert "      └─ ack /queue/orders  CLIENT" in body
    assert "└─ receive /queue/orders  CLIENT" in body
    assert "   └─ link to send /queue/orders (the producer's context)" in body
    # the served node is the one the replay went to
    replay = next(x for x in lines if "event amqtransport.send.replayed" in x)
    new_port = replay.rsplit(":", 1)[1]
    assert lines[1].split("server 127.0.0.1:")[1].startswith(new_port)
