"""The client against our broker running as a real process (BrokerProcess): SIGKILL under
a producer and a consumer, failover between two brokers, half-open detection."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import amqtransport
from amqtransport.errors import AuthenticationError, ConnectError, ConnectionClosed
from amqtransport.testing.broker_process import BrokerProcess

pytestmark = pytest.mark.timeout(120)

FAST = "initialReconnectDelay=20&maxReconnectDelay=200"


class Events:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.resumed = threading.Event()

    def on_interrupted(self, error: BaseException) -> None:
        self.interrupted_at = time.monotonic()
        self.calls.append(("interrupted", type(error).__name__))

    def on_resumed(self, address: str) -> None:
        self.calls.append(("resumed", address))
        self.resumed.set()

    def on_failed(self, error: BaseException) -> None:
        self.calls.append(("failed", type(error).__name__))


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    with BrokerProcess(tmp_path / "data", log_dir=tmp_path / "logs") as proc:
        yield proc


def test_send_receive_ack_and_broker_dedupe(broker: BrokerProcess) -> None:
    with amqtransport.connect(broker.uri) as conn:
        assert conn.connected_uri == broker.uri
        sub = conn.subscribe("/queue/basic", ack="client-individual")
        conn.send("/queue/basic", "hello", headers={"color": "blue"}, idempotency_key="k1")
        conn.send("/queue/basic", "hello", idempotency_key="k1")  # dropped by the broker, still receipted
        conn.send("/queue/basic", b"\x00\x01binary")
        m1, m2 = sub.receive(5), sub.receive(5)
        assert m1 is not None and m2 is not None
        assert (m1.text, m1.headers["color"], m1.idempotency_key, m1.destination) == ("hello", "blue", "k1",
                                                                                     "/queue/basic")
        assert m2.body == b"\x00\x01binary"
        m1.ack()
        m2.ack()
        assert sub.receive(0.3) is None
        with conn.transaction() as tx:
            tx.send("/queue/basic", "in-tx")
            assert sub.receive(0.3) is None  # not visible before commit
        msg = sub.receive(5)
        assert msg is not None and msg.text == "in-tx"
        msg.ack()


def test_plain_tcp_connect_errors_are_transport_errors(tmp_path: Path) -> None:
    from amqtransport.testing.ports import free_port

    with pytest.raises(ConnectError):
        amqtransport.connect(f"tcp://127.0.0.1:{free_port()}", connect_timeout=2)


def test_direct_connection_reports_a_killed_broker(broker: BrokerProcess) -> None:
    events = Events()
    conn = amqtransport.connect(broker.uri, listener=events)
    try:
        broker.kill()
        deadline = time.monotonic() + 10
        while conn.is_connected and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not conn.is_connected
        while not events.calls and time.monotonic() < deadline:  # told right after
            time.sleep(0.01)
        assert events.calls == [("failed", "ConnectionClosed")]
        with pytest.raises(ConnectionClosed):
            conn.send("/queue/x", "nope")
    finally:
        conn.close()


def test_sigkill_under_producer_and_consumer_then_restart_loses_nothing(broker: BrokerProcess) -> None:
    uri = f"failover:({broker.uri})?{FAST}"
    total = 600
    dest = "/queue/crash"
    receipted: list[str] = []
    received: list[str] = []
    prod_events, cons_events = Events(), Events()
    consumer = amqtransport.connect(uri, listener=cons_events, heartbeat=(500, 500))
    producer = amqtransport.connect(uri, listener=prod_events, heartbeat=(500, 500))
    try:
        sub = consumer.subscribe(dest, ack="client-individual")
        stop = threading.Event()

        def consume() -> None:
            while not stop.is_set():
                msg = sub.receive(0.2)
                if msg is not None:
                    received.append(msg.text)
                    msg.ack()

        reader = threading.Thread(target=consume)
        reader.start()

        def crash() -> None:
            broker.kill()
            time.sleep(0.3)
            broker.start()  # same data dir and port

        crasher = threading.Thread(target=crash)
        with producer.producer(window=20) as p:
            for i in range(total):
                p.send(dest, f"m{i}", idempotency_key=f"crash-{i}")
                receipted.append(f"m{i}")
                if i == total // 3:
                    crasher.start()
        crasher.join()
        assert p.receipted == total
        deadline = time.monotonic() + 30
        while len(set(received)) < total and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        reader.join()
        assert set(received) == set(receipted), f"lost {sorted(set(receipted) - set(received))[:10]}"
        assert len(received) == len(set(received)), "the duplicate filter let a copy through"
        for ev in (prod_events, cons_events):  # a SIGKILL shows up as a close or a reset
            assert ev.resumed.wait(10)
            assert ev.calls[0] in (("interrupted", "ConnectionClosed"), ("interrupted", "ReadError"))
            assert ev.calls[1] == ("resumed", broker.uri)
        # the consumer acked everything: nothing is left on the broker
        with amqtransport.connect(broker.uri) as check:
            assert check.subscribe(dest).receive(0.5) is None
    finally:
        producer.close()
        consumer.close()


def test_failover_between_two_independent_brokers(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "a", log_dir=tmp_path / "la") as a, \
            BrokerProcess(tmp_path / "b", log_dir=tmp_path / "lb") as b:
        uri = f"failover:({a.uri},{b.uri})?randomize=false&{FAST}"
        events = Events()
        receipted: list[str] = []
        with amqtransport.connect(uri, listener=events) as conn:
            sub = conn.subscribe("/queue/two")
            assert conn.connected_uri == a.uri
            with conn.producer(window=10) as p:
                for i in range(300):
                    p.send("/queue/two", f"m{i}", idempotency_key=f"two-{i}")
                    receipted.append(f"m{i}")
                    if i == 100:
                        a.kill()
            assert conn.connected_uri == b.uri
            assert events.resumed.wait(10)
            assert [c[0] for c in events.calls] == ["interrupted", "resumed"]
            assert events.calls[1] == ("resumed", b.uri)
            # the subscription followed us to b without user code
            conn.send("/queue/two", "on-b")
            got = []
            while True:
                msg = sub.receive(2)
                if msg is None:
                    break
                got.append(msg.text)
            assert "on-b" in got
        # what a receipted before the kill is still in a's store; the rest went to b
        a.start()
        seen = set(got)
        for proc in (a, b):
            with amqtransport.connect(proc.uri) as c:
                s = c.subscribe("/queue/two")
                while (msg := s.receive(0.5)) is not None:
                    seen.add(msg.text)
        assert set(receipted) <= seen


def test_heartbeat_detects_a_half_open_broker(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "a", log_dir=tmp_path / "la") as a, \
            BrokerProcess(tmp_path / "b", log_dir=tmp_path / "lb") as b:
        events = Events()
        uri = f"failover:({a.uri},{b.uri})?randomize=false&{FAST}"
        # a stopped process still accepts TCP (the kernel does): the 1 s connect timeout
        # (for the CONNECTED answer) moves the reconnect on to b
        with amqtransport.connect(uri, listener=events, heartbeat=(200, 200), connect_timeout=1.0) as conn:
            assert conn.transport.link.expect_every_ms == 200  # type: ignore[attr-defined]
            os.kill(a.pid, signal.SIGSTOP)  # the socket stays open but nothing answers
            try:
                t0 = time.monotonic()
                assert events.resumed.wait(10)
                detected = events.interrupted_at - t0
                assert events.calls[0] == ("interrupted", "HeartbeatTimeout")
                assert conn.connected_uri == b.uri
                assert detected < 3.0, detected  # 2 intervals = 0.4 s, plus scheduling slack
                conn.send("/queue/hb", "after")
            finally:
                os.kill(a.pid, signal.SIGCONT)


def test_bad_credentials_raise_authentication_error(tmp_path: Path) -> None:
    users = tmp_path / "users.txt"
    users.write_text("alice:secret\n")
    proc = BrokerProcess(tmp_path / "d", args=("--users", str(users)), log_dir=tmp_path / "l").start()
    try:
        with amqtransport.connect(proc.uri, login="alice", passcode="secret") as conn:
            conn.send("/queue/auth", "ok")
        with pytest.raises(AuthenticationError):
            amqtransport.connect(f"failover:({proc.uri})", login="alice", passcode="wrong")
    finally:
        proc.terminate()


def test_server_header_is_exposed(broker: BrokerProcess) -> None:
    with amqtransport.connect(f"failover:({broker.uri})") as conn:
        assert conn.server is not None and conn.server.startswith("amqtransport/")
        assert conn.transport.connected_frame is not None


@pytest.mark.parametrize("mode", ["replicated", "shared-store"])
def test_master_kill_of_our_ha_pair_under_producer_and_consumer(mode: str, tmp_path: Path) -> None:
    from amqtransport.testing.broker_pair import BrokerPair

    with BrokerPair(mode, tmp_path / "pair") as pair:
        uri = pair.uri + "&" + FAST
        master = pair.wait_master()
        events = Events()
        received: list[str] = []
        total = 400
        with amqtransport.connect(uri, heartbeat=(500, 500)) as consumer, \
                amqtransport.connect(uri, listener=events, heartbeat=(500, 500)) as producer:
            sub = consumer.subscribe("/queue/pair", ack="client-individual")
            with producer.producer(window=20) as p:
                for i in range(total):
                    p.send("/queue/pair", f"m{i}", idempotency_key=f"pair-{i}")
                    if i == 150:
                        master.kill()
            assert events.resumed.wait(10)
            assert [c[0] for c in events.calls] == ["interrupted", "resumed"]
            assert producer.connected_uri == pair.other(master).uri
            deadline = time.monotonic() + 30
            while len(set(received)) < total and time.monotonic() < deadline:
                msg = sub.receive(0.5)
                if msg is not None:
                    received.append(msg.text)
                    msg.ack()
            assert set(received) == {f"m{i}" for i in range(total)}
            assert len(received) == total  # the broker's dedupe and ours: no visible copy
