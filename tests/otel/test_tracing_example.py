"""examples/tracing.py as a person runs it: a spoke pair and a hub pair with
--otel-endpoint, a bridge agent with otel_endpoint, a send across a frozen then killed
spoke master, the consumer on the hub; it prints one trace tree: the producer's send
(replayed, with its events), under it the spoke broker's span with its fsync and the
bridge's forward span, under that the bridge's send, the hub broker's span (fsync,
replication wait) and the consumer's process and ack spans."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]

EXPECTED = [  # the first trace, line by line, without durations and ports
    "└─ send /queue/orders  PRODUCER",
    "   ├─ event amqtransport.failover.interrupted  lost tcp://127.0.0.1:",
    "   ├─ event amqtransport.failover.reconnected  new tcp://127.0.0.1:",
    "   ├─ event amqtransport.send.replayed  tcp://127.0.0.1:",
    "   ├─ send /queue/orders  SERVER",
    "   │  └─ journal fsync  INTERNAL",
    "   └─ forward /queue/orders  INTERNAL",
    "      └─ send /queue/orders  PRODUCER",
    "         ├─ send /queue/orders  SERVER",
    "         │  ├─ journal fsync  INTERNAL",
    "         │  └─ replication wait  INTERNAL",
    "         └─ process /queue/orders  CONSUMER",
    "            └─ ack /queue/orders  CLIENT",
]


def test_the_example_prints_one_readable_trace_tree() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "tracing.py")], capture_output=True,
                         text=True, timeout=170)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("trace ")
    first = lines[1:1 + len(EXPECTED)]
    assert [x[:len(e)] for x, e in zip(first, EXPECTED, strict=True)] == EXPECTED, out.stdout
    assert first[0].endswith("replayed")
    # the node that served the replayed send is the one the replay went to
    new_port = first[3].rsplit(":", 1)[1]
    assert first[0].split("server 127.0.0.1:")[1].startswith(new_port)
    assert "   └─ link to send /queue/orders (the producer's context)" in out.stdout
