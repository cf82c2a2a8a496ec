"""``amq broker pair --http-port P --slave-http-port P2`` as a newcomer runs it: both
consoles, both nodes on the master's overview, readiness, replication lag in the
metrics, a DLQ retry through the master's API, then a real SIGKILL of the master:
the slave's ``/readyz`` turns 200 as soon as its client port accepts and its console
shows it as master."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from http_helpers import Console, dead_letter, metric, receipt_stages, wait_http

import amqtransport
from amqtransport.testing.ports import free_port


class PairRun:
    """The ``amq broker pair`` process and the lines it prints."""

    def __init__(self, tmp: Path) -> None:
        self.ports = [free_port() for _ in range(4)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "amqtransport", "broker", "pair", "--port", str(self.ports[0]),
             "--slave-port", str(self.ports[1]), "--http-port", str(self.ports[2]),
             "--slave-http-port", str(self.ports[3]), "--data-dir", str(tmp / "pair")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode("utf-8", "replace").rstrip())

    def wait_line(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r}; lines: {self.lines[-20:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._reader.join(5)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[PairRun]:
    run = PairRun(tmp_path)
    try:
        yield run
    finally:
        run.stop()


def _console(port: int, tmp: Path) -> Console:
    class _P:  # Console wants a process for its uri/log only
        uri = ""

        def log_text(self) -> str:
            return ""

    wait_http(port)
    return Console(_P(), port)  # type: ignore[arg-type]


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def test_pair_consoles_failover_and_readiness(pair: PairRun, tmp_path: Path) -> None:
    a_line = pair.wait_line(r"node a: role master pid (\d+) .* console http://127\.0\.0\.1:(\d+)/")
    pair.wait_line(r"node b: role slave pid \d+ .* console http://127\.0\.0\.1:(\d+)/")
    master_pid = int(a_line.group(1))
    a = _console(pair.ports[2], tmp_path)
    b = _console(pair.ports[3], tmp_path)
    uri = f"failover:(tcp://127.0.0.1:{pair.ports[0]},tcp://127.0.0.1:{pair.ports[1]})?randomize=false"

    # readiness: the master serves, the slave does not; both are alive
    assert a.get("/readyz").status_code == 200
    r = b.get("/readyz")
    assert r.status_code == 503 and "slave" in r.text
    assert a.get("/healthz").status_code == 200 and b.get("/healthz").status_code == 200

    # the master's overview knows both nodes, with their roles and the slave's state
    nodes = {n["name"]: n for n in a.json("/api/overview")["nodes"]}
    assert nodes["a"]["role"] == "master" and nodes["a"]["self"] is True
    assert nodes["b"]["role"] == "slave" and nodes["b"]["reachable"] is True
    assert nodes["b"]["http"] == f"127.0.0.1:{pair.ports[3]}"
    assert nodes["a"]["peer_state"] == "in-sync"

    # a DLQ message retried from the master's console, with the pair's failover URI for traffic
    dead_letter(uri, "orders", ["o1", "o2"])
    assert a.depth("DLQ.orders") == 2
    first = a.json("/api/queues/DLQ.orders/messages")["messages"][0]
    r = a.post("/api/queues/DLQ.orders/retry", {"ids": [first["id"]]})
    assert r.status_code == 200, r.text
    assert a.depth("DLQ.orders") == 1 and a.depth("orders") == 1

    # metrics: role, epoch, replication lag (records and bytes) on the master
    text = a.metrics()
    assert metric(text, "amq_ha_role", {"role": "master"}) == 1
    assert metric(text, "amq_replication_peer_state", {"state": "in-sync"}) == 1
    assert metric(text, "amq_replication_lag_records") is not None
    assert metric(text, "amq_replication_lag_bytes") is not None
    assert metric(text, "amq_queue_depth", {"queue": "DLQ.orders"}) == 1
    epoch = metric(text, "amq_ha_epoch")
    slave_text = b.metrics()
    assert metric(slave_text, "amq_ha_role", {"role": "slave"}) == 1 and metric(slave_text, "amq_ready") == 0
    assert metric(slave_text, "amq_store_messages") == 2  # the replica holds both messages
    slave_page = b.get("/").text  # its overview says so (it said "no queues yet")
    assert "no queues yet" not in slave_page and "it holds 2 stored messages" in slave_page, slave_page

    # the receipt path's stages (issue 27): each receipted send streamed, acked by the slave, released
    n = 10
    before, slave_before = receipt_stages(a.metrics()), receipt_stages(b.metrics())
    with amqtransport.connect(f"tcp://127.0.0.1:{pair.ports[0]}") as c:
        for i in range(n):
            c.send("/queue/stages", f"s{i}")
    after, slave_after = receipt_stages(a.metrics()), receipt_stages(b.metrics())
    assert after["total"]["count"] - before["total"]["count"] == n
    for stage in ("replication_send", "slave_ack", "gate_wait", "journal_sync", "handoff"):
        assert after[stage]["count"] - before[stage]["count"] >= n, (stage, before[stage], after[stage])
    for stage in ("journal_queue", "journal_sync", "receipt_write"):  # the slave's own journal, its acks
        assert slave_after[stage]["count"] - slave_before[stage]["count"] >= n, stage
    # the slave's own share of the path (issue 27): each replication read is counted (one read
    # may carry several sends); its "total" is read -> ACK written, for reads its loop fsynced
    assert slave_after["read"]["count"] - slave_before["read"]["count"] >= 1

    # a slave refuses actions: it serves no clients
    r = b.post("/api/queues/DLQ.orders/purge")
    assert r.status_code == 503 and "serves no clients" in r.json()["error"]

    # SIGKILL the master; poll the slave's client port and /readyz
    os.kill(master_pid, signal.SIGKILL)
    t_kill = time.monotonic()
    bound_at = ready_at = None
    first_after_bind: int | None = None
    deadline = t_kill + 30
    while time.monotonic() < deadline and ready_at is None:
        accepting = _accepts(pair.ports[1])
        if accepting and bound_at is None:
            bound_at = time.monotonic()
        status = requests.get(b.url + "/readyz", timeout=5).status_code
        if accepting and first_after_bind is None:
            first_after_bind = status
        if status == 200:
            ready_at = time.monotonic()
            assert _accepts(pair.ports[1]), "/readyz said 200 but the client port refuses"
            bound_at = bound_at or ready_at
        else:
            time.sleep(0.005)
    assert ready_at is not None and bound_at is not None, f"the slave never turned ready; {pair.lines[-10:]}"
    # readiness follows the client port: once it accepts, the next probe already says 200
    assert first_after_bind in (None, 200), "the slave accepted clients but /readyz still said 503"
    print(f"\nslave: client port accepted {bound_at - t_kill:.3f} s after the SIGKILL, "
          f"/readyz 200 {ready_at - bound_at:.3f} s after that")
    ov = b.json("/api/overview")
    assert ov["node"]["role"] == "master" and ov["node"]["ready"] is True
    assert ov["node"]["epoch"] == epoch + 1
    assert ov["node"]["takeovers"] == 1
    page = b.get("/").text
    assert 'id="node-role" class="role role-master">master<' in page
    assert b.depth("DLQ.orders") == 1 and b.depth("orders") == 1  # nothing lost in the takeover
    assert metric(b.metrics(), "amq_ha_takeovers_total") == 1
    with amqtransport.connect(uri) as c:
        sub = c.subscribe("/queue/orders")
        m = sub.receive(timeout=10)
        assert m is not None and m.text == first["body"]
