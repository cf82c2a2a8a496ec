"""The client against a real ActiveMQ Classic 5.17 shared-store master/slave pair.

ActiveMQ does not drop duplicate STOMP sends by a header, so a send replayed after the
failover may be stored twice: the consumer's duplicate filter (keyed by our
idempotency header, which ActiveMQ carries through) removes them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import amqtransport
from amqtransport.errors import ReconnectExhausted
from amqtransport.processes.activemq import ActiveMQPair
from amqtransport.testing.wait import wait_for

pytestmark = [pytest.mark.activemq, pytest.mark.timeout(240)]


class Events:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.resumed = threading.Event()
        self.failed = threading.Event()

    def on_interrupted(self, error: BaseException) -> None:
        self.calls.append(("interrupted", error))

    def on_resumed(self, address: str) -> None:
        self.calls.append(("resumed", address))
        self.resumed.set()

    def on_failed(self, error: BaseException) -> None:
        self.calls.append(("failed", error))
        self.failed.set()


def drain(sub: amqtransport.Subscription, want: set[str], timeout: float = 60.0) -> set[str]:
    got: set[str] = set()
    deadline = time.monotonic() + timeout
    while not want <= got and time.monotonic() < deadline:
        msg = sub.receive(1.0)
        if msg is not None:
            got.add(msg.text)
            msg.ack()
    return got


def test_producer_survives_master_kill_and_slave_has_every_receipted_message(
        activemq_pair: ActiveMQPair) -> None:
    pair = activemq_pair
    master_uri, slave_uri = pair.master.uri, pair.slave.uri
    events = Events()
    receipted: list[str] = []
    total = 400
    with amqtransport.connect(pair.uri, listener=events, heartbeat=(1000, 1000)) as conn:
        assert conn.connected_uri == master_uri.split("?")[0]
        killer: threading.Thread | None = None
        with conn.producer(window=20) as producer:
            for i in range(total):
                body = f"msg-{i}"
                producer.send("/queue/interop.failover", body, idempotency_key=f"k-{i}")
                receipted.append(body)
                if i == 100:
                    killer = threading.Thread(target=pair.master.kill)
                    killer.start()
        assert killer is not None
        killer.join()
        assert events.resumed.wait(10)  # on_resumed follows the replay it may race with
        assert conn.connected_uri == slave_uri.split("?")[0]
        assert [c[0] for c in events.calls] == ["interrupted", "resumed"]
    # every receipted message is on the slave (the flush above waited for all receipts)
    with amqtransport.connect(pair.uri) as conn:
        assert conn.connected_uri == slave_uri.split("?")[0]
        sub = conn.subscribe("/queue/interop.failover", ack="client-individual")
        got = drain(sub, set(receipted))
        assert set(receipted) <= got, f"missing {sorted(set(receipted) - got)[:10]}"
        # nothing beyond what we sent, and the filter hid ActiveMQ's duplicates
        extra = sub.receive(1.0)
        assert extra is None, extra


def test_max_reconnect_attempts_zero_raises_instead_of_retrying(activemq_pair: ActiveMQPair) -> None:
    pair = activemq_pair
    events = Events()
    conn = amqtransport.connect(pair.uri + "&maxReconnectAttempts=0", listener=events)
    try:
        conn.send("/queue/interop.zero", "before")
        pair.master.kill()
        assert events.failed.wait(30)
        assert isinstance(events.calls[-1][1], ReconnectExhausted)
        with pytest.raises(ReconnectExhausted):
            conn.send("/queue/interop.zero", "after")
        assert not conn.is_connected
    finally:
        conn.close()


def test_subscription_continues_after_failover(activemq_pair: ActiveMQPair) -> None:
    pair = activemq_pair
    events = Events()
    with amqtransport.connect(pair.uri, listener=events, heartbeat=(1000, 1000)) as consumer:
        sub = consumer.subscribe("/queue/interop.sub", ack="client-individual")
        with amqtransport.connect(pair.uri) as producer:
            for i in range(10):
                producer.send("/queue/interop.sub", f"before-{i}")
        got = drain(sub, {f"before-{i}" for i in range(10)}, timeout=20)
        assert got == {f"before-{i}" for i in range(10)}
        pair.master.kill()
        assert events.resumed.wait(60)
        # a producer on the new master; the old subscription gets them without user code
        with amqtransport.connect(pair.uri) as producer:
            assert producer.connected_uri == pair.slave.uri.split("?")[0]
            for i in range(10):
                producer.send("/queue/interop.sub", f"after-{i}")
        got = drain(sub, {f"after-{i}" for i in range(10)}, timeout=30)
        assert {f"after-{i}" for i in range(10)} <= got
        assert consumer.connected_uri == pair.slave.uri.split("?")[0]


def test_amq_send_through_a_master_kill_then_amq_recv_gets_all(activemq_pair: ActiveMQPair) -> None:
    """The issue's "done when": amq send through a master kill, amq recv gets every message."""
    import json
    import subprocess
    import sys

    pair = activemq_pair
    count = 6000
    amq = [sys.executable, "-m", "amqtransport"]
    proc = subprocess.Popen([*amq, "send", pair.uri, "/queue/interop.cli", "--count", str(count), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_client_connected(pair.master.stomp_port, proc)
        time.sleep(0.5)  # let it send for a while
        pair.master.kill()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    sent = json.loads(out.strip().splitlines()[-1])
    assert sent["sent"] == count
    assert sent["failovers"] >= 1, "the kill did not land mid-run"
    assert sent["connected"] == pair.slave.uri.split("?")[0]
    res = subprocess.run([*amq, "recv", pair.uri, "/queue/interop.cli", "--count", str(count), "--timeout", "10",
                          "--json"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["received"] == count


def _wait_client_connected(port: int, proc: Any, timeout: float = 30.0) -> None:
    """Wait until some process holds an ESTABLISHED TCP connection to 127.0.0.1:port
    (read from /proc/net/tcp; nothing else talks to the master during the test)."""
    want = f"{port:04X}"

    def connected() -> bool:
        if proc.poll() is not None:
            return True
        with open("/proc/net/tcp") as fh:
            return any(p[2].endswith(":" + want) and p[3] == "01" for p in (line.split() for line in fh.readlines()[1:]))

    wait_for(connected, timeout, f"a client connected to port {port}", interval=0.05)
