"""ActiveMQ Classic 5.17 harness figures: node start time and shared-store takeover time.

Run: .venv/bin/python benchmarks/bench_activemq_harness.py   (AMQ_BENCH_QUICK=1: one round each)

- start: spawn of the JVM -> first STOMP CONNECTED, single node (tuned JVM flags, and
  the plain ``-Xmx256m`` command of the notes as the peer, alternating rounds).
- takeover: SIGKILL of the master -> the slave answers STOMP CONNECT, shared-store pair
  with lockAcquireSleepInterval 500 ms, for lockKeepAlivePeriod 2000 ms (the notes'
  config) and 500 ms. The slave sleeps one keep-alive period after getting the lock
  (SharedFileLocker), so the keep-alive dominates.
These are the numbers behind the harness's timeouts and the chaos scenarios' bounds.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import compare, print_table, scale, write_result  # noqa: E402

from amqtransport.processes import activemq  # noqa: E402
from amqtransport.processes.activemq import ActiveMQNode, ActiveMQPair, missing_reason  # noqa: E402


def node_start(base: Path, flags: tuple[str, ...]) -> float:
    saved = activemq.JVM_FLAGS
    activemq.JVM_FLAGS = flags
    try:
        node = ActiveMQNode(Path(tempfile.mkdtemp(dir=base)), "bench")
        with node:
            assert node.start_seconds is not None
            return float(node.start_seconds)
    finally:
        activemq.JVM_FLAGS = saved


def takeover(base: Path, keepalive_ms: int) -> float:
    with ActiveMQPair(Path(tempfile.mkdtemp(dir=base)), 500, lock_keepalive_ms=keepalive_ms) as pair:
        t0 = time.monotonic()
        pair.kill_master()
        node = pair.wait_master(timeout=60)
        elapsed = time.monotonic() - t0
        assert node is pair.slave
        return elapsed


def main() -> None:
    reason = missing_reason()
    if reason:
        print(f"skipped: {reason}")
        return
    base = Path(tempfile.mkdtemp(prefix="bench-activemq-"))
    rows: list[dict[str, object]] = []
    try:
        c = compare(
            lambda: node_start(base, activemq.JVM_FLAGS),
            lambda: node_start(base, ("-Xmx256m",)),
            rounds=scale(5, 1),
        )
        rows.append({"case": "node start, tuned JVM flags (s)", "median": c.ours,
                     "min": min(c.ours_all), "max": max(c.ours_all), "n": len(c.ours_all)})
        rows.append({"case": "node start, plain -Xmx256m (s)", "median": c.peer,
                     "min": min(c.peer_all), "max": max(c.peer_all), "n": len(c.peer_all)})
        takeovers: dict[int, float] = {}
        for keepalive in (2000, 500):
            times = [takeover(base, keepalive) for _ in range(scale(3, 1))]
            takeovers[keepalive] = statistics.median(times)
            rows.append({"case": f"takeover after SIGKILL, keepalive {keepalive} ms (s)",
                         "median": takeovers[keepalive], "min": min(times), "max": max(times),
                         "n": len(times)})
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print_table(rows, title="ActiveMQ 5.17 harness (lockAcquireSleepInterval 500 ms)")
    write_result(
        "activemq_harness",
        rows,
        headline={
            "node start s": round(c.ours, 2),
            "start speed-up vs plain JVM": round(c.peer / c.ours, 2),
            "takeover s (keepalive 2000)": round(takeovers[2000], 2),
            "takeover s (keepalive 500)": round(takeovers[500], 2),
        },
        notes="start = spawn to STOMP CONNECTED; takeover = SIGKILL of master to slave CONNECTED",
    )


if __name__ == "__main__":
    main()
