"""Failover logic on the scripted in-memory backend: exact schedules (injected sleep),
attempts semantics, randomize, priority backup, replay, listeners, transactions."""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

import pytest

import amqtransport
from amqtransport._backends.memory import MemoryBackend, ScriptedBroker
from amqtransport.errors import (
    AuthenticationError,
    HeartbeatTimeout,
    ReconnectExhausted,
    SendTimeout,
    TransactionRolledBack,
)
from amqtransport.stomp import IDEMPOTENCY_HEADER
from amqtransport.testing.wait import wait_for

pytestmark = pytest.mark.timeout(30)



class Recorder:
    """Listener recording calls in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.event = threading.Event()

    def on_interrupted(self, error: BaseException) -> None:
        self.calls.append(("interrupted", type(error).__name__))

    def on_resumed(self, address: str) -> None:
        self.calls.append(("resumed", address))
        self.event.set()

    def on_failed(self, error: BaseException) -> None:
        self.calls.append(("failed", type(error).__name__))
        self.event.set()


@pytest.fixture
def backend() -> MemoryBackend:
    return MemoryBackend()


def two(backend: MemoryBackend) -> tuple[ScriptedBroker, ScriptedBroker]:
    return backend.add("a:1"), backend.add("b:2")


URI2 = "failover:(tcp://a:1,tcp://b:2)?randomize=false"


# -- schedules ---------------------------------------------------------------------------


def test_startup_schedule_exact_delays_and_order(backend: MemoryBackend) -> None:
    a, b = two(backend)
    a.up = b.up = False
    sleeps: list[float] = []
    with pytest.raises(ReconnectExhausted) as info:
        amqtransport.connect(URI2 + "&startupMaxReconnectAttempts=4&maxReconnectDelay=25",
                             backend=backend, sleep=sleeps.append)
    assert sleeps == [0.01, 0.02, 0.025]  # 10, 20, 40 capped at 25: between passes only
    assert backend.connect_log == ["a:1", "b:2"] * 4
    assert info.value.attempts == 8
    assert "startupMaxReconnectAttempts" in str(info.value)


def test_no_exponential_backoff_is_constant(backend: MemoryBackend) -> None:
    a, b = two(backend)
    a.up = b.up = False
    sleeps: list[float] = []
    with pytest.raises(ReconnectExhausted):
        amqtransport.connect(URI2 + "&maxReconnectAttempts=3&useExponentialBackOff=false&initialReconnectDelay=7",
                             backend=backend, sleep=sleeps.append)
    assert sleeps == [0.007, 0.007]


def test_startup_with_zero_attempts_is_one_pass(backend: MemoryBackend) -> None:
    a, b = two(backend)
    a.up = False
    sleeps: list[float] = []
    with amqtransport.connect(URI2 + "&maxReconnectAttempts=0", backend=backend, sleep=sleeps.append) as conn:
        assert conn.connected_uri == "tcp://b:2"
    assert sleeps == []
    assert backend.connect_log == ["a:1", "b:2"]


def test_zero_attempts_after_a_loss_raises_straight_up(backend: MemoryBackend) -> None:
    a, b = two(backend)
    rec = Recorder()
    conn = amqtransport.connect(URI2 + "&maxReconnectAttempts=0", backend=backend, sleep=lambda s: None,
                                listener=rec)
    try:
        before = list(backend.connect_log)
        a.drop()
        assert rec.event.wait(5)
        assert rec.calls == [("interrupted", "ConnectionClosed"), ("failed", "ReconnectExhausted")]
        assert backend.connect_log == before  # not one reconnect attempt, though b is up
        with pytest.raises(ReconnectExhausted):
            conn.send("/queue/x", "after")
        assert not conn.is_connected
    finally:
        conn.close()


def test_n_attempts_after_a_loss_then_failed(backend: MemoryBackend) -> None:
    a, b = two(backend)
    sleeps: list[float] = []
    rec = Recorder()
    conn = amqtransport.connect(URI2 + "&maxReconnectAttempts=3", backend=backend, sleep=sleeps.append, listener=rec)
    try:
        sub = conn.subscribe("/queue/q")
        a.up = b.up = False
        a.drop()
        assert rec.event.wait(5)
        assert sleeps == [0.01, 0.02]
        # the lost broker a goes last in every pass (ActiveMQ's getConnectList)
        assert backend.connect_log[1:] == ["b:2", "a:1"] * 3
        assert rec.calls[-1] == ("failed", "ReconnectExhausted")
        with pytest.raises(ReconnectExhausted):
            sub.receive(1)
    finally:
        conn.close()


def test_forever_keeps_going_with_growing_delays(backend: MemoryBackend) -> None:
    a, b = two(backend)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 6:
            b.up = True

    rec = Recorder()
    conn = amqtransport.connect(URI2 + "&maxReconnectDelay=100", backend=backend, sleep=sleep, listener=rec)
    try:
        a.up = b.up = False
        a.drop()
        assert rec.event.wait(5)
        assert sleeps == [0.01, 0.02, 0.04, 0.08, 0.1, 0.1]
        assert conn.connected_uri == "tcp://b:2"
        assert rec.calls == [("interrupted", "ConnectionClosed"), ("resumed", "tcp://b:2")]
    finally:
        conn.close()


def test_jitter_stays_within_bounds(backend: MemoryBackend) -> None:
    a, b = two(backend)
    a.up = b.up = False
    sleeps: list[float] = []
    with pytest.raises(ReconnectExhausted):
        amqtransport.connect(URI2 + "&maxReconnectAttempts=5&reconnectJitter=0.5", backend=backend,
                             sleep=sleeps.append, rng=random.Random(7))
    base = [0.01, 0.02, 0.04, 0.08]
    assert len(sleeps) == 4
    assert all(b_ <= s <= b_ * 1.5 for s, b_ in zip(sleeps, base, strict=True))
    assert sleeps != base


def test_randomize_shuffles_each_pass(backend: MemoryBackend) -> None:
    names = [f"h{i}:{i}" for i in range(1, 6)]
    for n in names:
        backend.add(n).up = False
    uri = "failover:(" + ",".join(f"tcp://{n}" for n in names) + ")?maxReconnectAttempts=4"
    with pytest.raises(ReconnectExhausted):
        amqtransport.connect(uri, backend=backend, sleep=lambda s: None, rng=random.Random(3))
    passes = [backend.connect_log[i:i + 5] for i in range(0, 20, 5)]
    assert all(sorted(p) == sorted(names) for p in passes)
    assert any(p != names for p in passes)
    assert len({tuple(p) for p in passes}) > 1


def test_warn_after_reconnect_attempts_logs(backend: MemoryBackend, caplog: pytest.LogCaptureFixture) -> None:
    a, b = two(backend)
    a.up = b.up = False
    with caplog.at_level(logging.WARNING, logger="amqtransport.transports.failover"):
        with pytest.raises(ReconnectExhausted):
            amqtransport.connect(URI2 + "&maxReconnectAttempts=3&warnAfterReconnectAttempts=2", backend=backend,
                                 sleep=lambda s: None)
    warnings = [r.getMessage() for r in caplog.records if "failed connect attempts" in r.getMessage()]
    assert len(warnings) == 3  # after attempts 2, 4 and 6


# -- priority backup, backups ---------------------------------------------------------------


def test_priority_backup_returns_to_first_uri(backend: MemoryBackend) -> None:
    a, b = two(backend)
    a.up = False
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        time.sleep(0.002)

    rec = Recorder()
    conn = amqtransport.connect(URI2 + "&priorityBackup=true", backend=backend, sleep=sleep, listener=rec)
    try:
        assert conn.connected_uri == "tcp://b:2"
        sub = conn.subscribe("/queue/p")
        wait_for(lambda: len(sleeps) >= 3)
        a.up = True
        wait_for(lambda: conn.connected_uri == "tcp://a:1")
        wait_for(lambda: ("resumed", "tcp://a:1") in rec.calls)  # told right after the switch
        assert [f.get("id") for f in a.frames("SUBSCRIBE")] == [sub.id]
        wait_for(lambda: not b.live)  # the backup link was retired
        a.deliver("/queue/p", "back home", {IDEMPOTENCY_HEADER: "k"})
        msg = sub.receive(2)
        assert msg is not None and msg.text == "back home"
    finally:
        conn.close()


def test_priority_uris_choose_the_priority_endpoint(backend: MemoryBackend) -> None:
    a, b = two(backend)
    c = backend.add("c:3")
    with amqtransport.connect("failover:(tcp://a:1,tcp://b:2,tcp://c:3)?randomize=false&priorityBackup=true"
                              "&priorityURIs=tcp://c:3", backend=backend, sleep=lambda s: None) as conn:
        assert conn.connected_uri == "tcp://c:3"
    assert a.connect_count == 0 and b.connect_count == 0 and c.connect_count == 1


def test_backup_pool_is_used_first(backend: MemoryBackend) -> None:
    a, b = two(backend)
    rec = Recorder()
    conn = amqtransport.connect(URI2 + "&backup=true", backend=backend, sleep=lambda s: None, listener=rec)
    try:
        wait_for(lambda: conn.transport.backup_links == 1)  # type: ignore[attr-defined]
        a.up = False
        a.drop()
        assert rec.event.wait(5)
        assert conn.connected_uri == "tcp://b:2"
        assert b.connect_count == 1  # the pre-connected backup was reused
    finally:
        conn.close()


# -- replay --------------------------------------------------------------------------------


def test_subscriptions_replayed_with_same_ids_before_pending_sends(backend: MemoryBackend) -> None:
    a, b = two(backend)
    rec = Recorder()
    conn = amqtransport.connect(URI2, backend=backend, sleep=lambda s: None, listener=rec)
    try:
        s1 = conn.subscribe("/queue/one", ack="client-individual", headers={"selector": "x = 1"})
        s2 = conn.subscribe("/topic/two")
        a.hold_receipts = True
        results: list[BaseException | None] = []

        def producer() -> None:
            try:
                with conn.producer(window=10) as p:
                    for i in range(5):
                        p.send("/queue/out", f"m{i}", idempotency_key=f"key-{i}")
                results.append(None)
            except BaseException as exc:  # pragma: no cover - reported below
                results.append(exc)

        t = threading.Thread(target=producer)
        t.start()
        wait_for(lambda: len(a.frames("SEND")) == 5)
        a.up = False
        a.drop()
        t.join(5)
        assert results == [None]
        cmds = [f.command for f in b.received]
        assert cmds == ["CONNECT", "SUBSCRIBE", "SUBSCRIBE"] + ["SEND"] * 5
        subs = b.frames("SUBSCRIBE")
        assert [(f.get("id"), f.get("destination"), f.get("ack")) for f in subs] == [
            (s1.id, "/queue/one", "client-individual"), (s2.id, "/topic/two", "auto")]
        assert subs[0].get("selector") == "x = 1"
        old, new = a.frames("SEND"), b.frames("SEND")
        assert [f.get(IDEMPOTENCY_HEADER) for f in new] == [f"key-{i}" for i in range(5)]
        assert [f.get("receipt") for f in new] == [f.get("receipt") for f in old]
        assert [f.body for f in new] == [f.body for f in old]
    finally:
        conn.close()


def test_unsubscribed_subscription_is_not_replayed(backend: MemoryBackend) -> None:
    a, b = two(backend)
    rec = Recorder()
    with amqtransport.connect(URI2, backend=backend, sleep=lambda s: None, listener=rec) as conn:
        keep = conn.subscribe("/queue/keep")
        conn.subscribe("/queue/gone").unsubscribe()
        a.up = False
        a.drop()
        assert rec.event.wait(5)
        assert [f.get("id") for f in b.frames("SUBSCRIBE")] == [keep.id]


def test_track_messages_replays_fire_and_forget_sends(backend: MemoryBackend) -> None:
    for track, expected in (("true", 3), ("false", 0)):
        backend = MemoryBackend()
        a, b = two(backend)
        rec = Recorder()
        with amqtransport.connect(URI2 + f"&trackMessages={track}", backend=backend, sleep=lambda s: None,
                                  listener=rec) as conn:
            for i in range(3):
                conn.send("/queue/ff", f"f{i}", receipt=False, idempotency_key=f"ff-{i}")
            a.up = False
            a.drop()
            assert rec.event.wait(5)
            wait_for(lambda: conn.is_connected)
            replayed = [f.get(IDEMPOTENCY_HEADER) for f in b.frames("SEND")]
            assert replayed == [f"ff-{i}" for i in range(expected)], track


def test_track_messages_cache_is_bounded(backend: MemoryBackend) -> None:
    a, b = two(backend)
    rec = Recorder()
    with amqtransport.connect(URI2 + "&trackMessages=true&maxCacheSize=1000", backend=backend,
                              sleep=lambda s: None, listener=rec) as conn:
        for i in range(10):
            conn.send("/queue/ff", b"x" * 300, receipt=False, idempotency_key=f"k{i}")
        a.up = False
        a.drop()
        assert rec.event.wait(5)
        wait_for(lambda: conn.is_connected)
        keys = [f.get(IDEMPOTENCY_HEADER) for f in b.frames("SEND")]
        assert 1 <= len(keys) <= 3 and keys == [f"k{i}" for i in range(10 - len(keys), 10)]


def test_send_while_disconnected_waits_then_goes_out(backend: MemoryBackend) -> None:
    a, b = two(backend)
    gate = threading.Event()

    def sleep(seconds: float) -> None:
        gate.wait(5)

    conn = amqtransport.connect(URI2, backend=backend, sleep=sleep)
    try:
        a.up = b.up = False
        a.drop()
        wait_for(lambda: not conn.is_connected)
        done = threading.Event()
        threading.Thread(target=lambda: (conn.send("/queue/late", "x", idempotency_key="late"), done.set())).start()
        time.sleep(0.05)
        assert not done.is_set()
        b.up = True
        gate.set()
        assert done.wait(5)
        assert [f.get(IDEMPOTENCY_HEADER) for f in b.frames("SEND")] == ["late"]
    finally:
        gate.set()
        conn.close()


def test_timeout_raises_send_timeout_while_disconnected(backend: MemoryBackend) -> None:
    a, b = two(backend)
    conn = amqtransport.connect(URI2 + "&timeout=150", backend=backend, sleep=lambda s: time.sleep(0.01))
    try:
        a.up = b.up = False
        a.drop()
        wait_for(lambda: not conn.is_connected)
        t0 = time.monotonic()
        with pytest.raises(SendTimeout):
            conn.send("/queue/x", "never")
        assert time.monotonic() - t0 >= 0.1
        with pytest.raises(SendTimeout):
            conn.send("/queue/x", "never", receipt=False)
    finally:
        conn.close()


def test_transaction_spanning_a_failover_fails_clearly(backend: MemoryBackend) -> None:
    a, b = two(backend)
    rec = Recorder()
    with amqtransport.connect(URI2, backend=backend, sleep=lambda s: None, listener=rec) as conn:
        with pytest.raises(TransactionRolledBack):
            with conn.transaction() as tx:
                tx.send("/queue/t", "one")
                a.up = False
                a.drop()
                assert rec.event.wait(5)
                wait_for(lambda: conn.is_connected)
                tx.send("/queue/t", "two")
        assert b.frames("COMMIT") == [] and b.frames("SEND") == []
        # a fresh transaction on the new link works
        with conn.transaction() as tx:
            tx.send("/queue/t", "three")
        assert [f.command for f in b.received[-3:]] == ["BEGIN", "SEND", "COMMIT"]


def test_commit_after_a_failover_raises(backend: MemoryBackend) -> None:
    a, b = two(backend)
    rec = Recorder()
    with amqtransport.connect(URI2, backend=backend, sleep=lambda s: None, listener=rec) as conn:
        tx = conn.transaction().__enter__()
        tx.send("/queue/t", "one")
        a.up = False
        a.drop()
        assert rec.event.wait(5)
        wait_for(lambda: conn.is_connected)
        with pytest.raises(TransactionRolledBack):
            tx.commit()
        assert b.frames("COMMIT") == []


# -- listeners -------------------------------------------------------------------------------


def test_listeners_in_order_and_a_raising_one_does_not_break_reconnect(backend: MemoryBackend) -> None:
    a, b = two(backend)

    class Broken:
        def on_interrupted(self, error: BaseException) -> None:
            raise RuntimeError("user bug")

        def on_resumed(self, address: str) -> None:
            raise RuntimeError("user bug")

    rec = Recorder()
    conn = amqtransport.connect(URI2, backend=backend, sleep=lambda s: None, listener=Broken())
    conn.add_listener(rec)
    try:
        for _ in range(3):  # a -> b -> a -> b
            current = a if conn.connected_uri == "tcp://a:1" else b
            other = b if current is a else a
            other.up, current.up = True, False
            rec.event.clear()
            current.drop()
            assert rec.event.wait(5)
            conn.send("/queue/x", "still works")
        assert [c[0] for c in rec.calls] == ["interrupted", "resumed"] * 3
        assert [c[1] for c in rec.calls if c[0] == "resumed"] == ["tcp://b:2", "tcp://a:1", "tcp://b:2"]
    finally:
        conn.close()


# -- duplicate filter --------------------------------------------------------------------------


def test_duplicate_filter_drops_redelivery_after_failover(backend: MemoryBackend) -> None:
    a, b = two(backend)
    rec = Recorder()
    with amqtransport.connect(URI2, backend=backend, sleep=lambda s: None, listener=rec) as conn:
        sub = conn.subscribe("/queue/d", ack="client-individual")
        a.deliver("/queue/d", "one", {IDEMPOTENCY_HEADER: "k1"})
        a.deliver("/queue/d", "two", {IDEMPOTENCY_HEADER: "k2"})
        m1, m2 = sub.receive(2), sub.receive(2)
        assert m1 is not None and m2 is not None
        m1.ack()
        a.up = False
        a.drop()
        assert rec.event.wait(5)
        wait_for(lambda: conn.is_connected)
        # the broker redelivers both (it never saw the acks on the dead link)
        r1 = b.deliver("/queue/d", "one", {IDEMPOTENCY_HEADER: "k1", "redelivered": "true"})
        r2 = b.deliver("/queue/d", "two", {IDEMPOTENCY_HEADER: "k2", "redelivered": "true"})
        b.deliver("/queue/d", "three", {IDEMPOTENCY_HEADER: "k3"})
        m3 = sub.receive(2)
        assert m3 is not None and m3.text == "three"
        assert sub.receive(0.05) is None
        assert conn.duplicates == 2
        # k1 was acked before: its copy is acked on arrival; k2 when the app acks the original
        wait_for(lambda: [f.get("id") for f in b.frames("ACK")] == [r1.get("ack")])
        m2.ack()
        wait_for(lambda: [f.get("id") for f in b.frames("ACK")] == [r1.get("ack"), r2.get("ack")])


def test_dedupe_off_and_nack_lets_redeliveries_through(backend: MemoryBackend) -> None:
    backend.add("a:1")
    with amqtransport.connect("tcp://a:1", backend=backend, dedupe=False) as conn:
        sub = conn.subscribe("/queue/d")
        broker = backend.brokers["a:1"]
        broker.deliver("/queue/d", "one", {IDEMPOTENCY_HEADER: "k1"})
        broker.deliver("/queue/d", "one", {IDEMPOTENCY_HEADER: "k1"})
        assert sub.receive(1) is not None and sub.receive(1) is not None
    backend2 = MemoryBackend()
    broker = backend2.add("a:1")
    with amqtransport.connect("tcp://a:1", backend=backend2) as conn:
        sub = conn.subscribe("/queue/d", ack="client")
        broker.deliver("/queue/d", "one", {IDEMPOTENCY_HEADER: "k1"})
        msg = sub.receive(1)
        assert msg is not None
        msg.nack()
        broker.deliver("/queue/d", "one", {IDEMPOTENCY_HEADER: "k1", "redelivered": "true"})
        again = sub.receive(1)
        assert again is not None and again.redelivered
        assert len(broker.frames("NACK")) == 1


# -- single endpoint ------------------------------------------------------------------------


def test_direct_transport_heartbeat_deadline_detects_half_open(backend: MemoryBackend) -> None:
    backend.add("a:1", heart_beat="50,50")
    rec = Recorder()
    conn = amqtransport.connect("tcp://a:1", backend=backend, heartbeat=(50, 50), listener=rec)
    try:
        t0 = time.monotonic()
        assert rec.event.wait(3)  # the scripted broker promised beats but never sends any
        elapsed = time.monotonic() - t0
        assert rec.calls == [("failed", "HeartbeatTimeout")]
        assert elapsed < 2.0
        with pytest.raises(HeartbeatTimeout):
            conn.send("/queue/x", "dead")
        # we did send our own beats while waiting
        broker = backend.brokers["a:1"]
        assert broker.connections[0].frames[0].get("heart-beat") == "50,50"
    finally:
        conn.close()


def test_failover_reconnects_after_heartbeat_timeout(backend: MemoryBackend) -> None:
    a, _b = backend.add("a:1", heart_beat="50,50"), backend.add("b:2")
    rec = Recorder()
    with amqtransport.connect(URI2, backend=backend, heartbeat=(50, 50), listener=rec,
                              sleep=lambda s: None) as conn:
        a.up = False
        assert rec.event.wait(3)
        assert rec.calls == [("interrupted", "HeartbeatTimeout"), ("resumed", "tcp://b:2")]
        conn.send("/queue/x", "ok")


def test_authentication_error_is_not_retried(backend: MemoryBackend) -> None:
    a, b = two(backend)
    a.auth_fail = True
    with pytest.raises(AuthenticationError):
        amqtransport.connect(URI2, backend=backend, login="u", passcode="bad", sleep=lambda s: None)
    assert backend.connect_log == ["a:1"]
    assert a.received[0].get("login") == "u" and a.received[0].get("passcode") == "bad"


def test_connect_frame_headers(backend: MemoryBackend) -> None:
    a = backend.add("a:1")
    with amqtransport.connect("tcp://a:1?heartBeat=0,0", backend=backend, login="me", passcode="pw",
                              vhost="vh", client_id="cid") as conn:
        assert conn.is_connected
    connect = a.received[0]
    assert connect.command == "CONNECT"
    assert connect.header_map == {"accept-version": "1.0,1.1,1.2", "host": "vh", "login": "me", "passcode": "pw",
                                  "client-id": "cid", "heart-beat": "0,0"}
    assert a.received[-1].command == "DISCONNECT"


def test_update_uris_url_adds_endpoints_before_reconnecting(backend: MemoryBackend, tmp_path: Any) -> None:
    a = backend.add("a:1")
    c = backend.add("c:3")
    listing = tmp_path / "uris.txt"
    listing.write_text("tcp://a:1, tcp://c:3\n")
    rec = Recorder()
    with amqtransport.connect(f"failover:(tcp://a:1)?randomize=false&updateURIsURL={listing}", backend=backend,
                              sleep=lambda s: None, listener=rec) as conn:
        assert conn.connected_uri == "tcp://a:1"
        a.up = False
        a.drop()
        assert rec.event.wait(5)
        assert conn.connected_uri == "tcp://c:3"
        assert c.connect_count == 1


def test_vm_uri_starts_an_in_process_broker() -> None:
    name = f"vmtest{time.monotonic_ns()}"
    with amqtransport.connect(f"vm://{name}") as conn:
        sub = conn.subscribe("/queue/vm")
        conn.send("/queue/vm", "in process")
        msg = sub.receive(5)
        assert msg is not None and msg.text == "in process"
        assert conn.connected_uri == f"vm://{name}"
    with amqtransport.connect(f"vm://{name}") as again:  # the same broker, still running
        assert again.is_connected


def test_concurrent_senders_share_a_connection_through_a_failover(backend: MemoryBackend) -> None:
    a, b = two(backend)
    rec = Recorder()
    errors: list[BaseException] = []
    with amqtransport.connect(URI2, backend=backend, sleep=lambda s: None, listener=rec) as conn:
        def worker(n: int) -> None:
            try:
                for i in range(100):
                    conn.send("/queue/mt", f"{n}-{i}", idempotency_key=f"{n}-{i}")
                    if n == 0 and i == 30:
                        a.up = False
                        a.drop()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert errors == []
        keys = {f.get(IDEMPOTENCY_HEADER) for f in a.frames("SEND") + b.frames("SEND")}
        assert keys == {f"{n}-{i}" for n in range(4) for i in range(100)}
        # a writer or the reader notices first: either way one interruption, one resume
        assert [c[0] for c in rec.calls] == ["interrupted", "resumed"]
        assert rec.calls[0][1] in ("ConnectionClosed", "WriteError") and rec.calls[1] == ("resumed", "tcp://b:2")


# -- trackMessages: the cache holds only what no receipt has proven yet -------------------------


def _replayed_keys(backend: MemoryBackend, a: ScriptedBroker, b: ScriptedBroker, conn: Any, rec: Recorder) -> list[str]:
    a.up = False
    a.drop()
    assert rec.event.wait(5)
    wait_for(lambda: conn.is_connected)
    return [f.get(IDEMPOTENCY_HEADER) or "" for f in b.frames("SEND")]


def test_track_messages_a_receipt_trims_the_cache(backend: MemoryBackend) -> None:
    """Any RECEIPT proves every frame written before it on that link: those cached
    fire-and-forget sends are not replayed after a later reconnect."""
    a, b = two(backend)
    rec = Recorder()
    with amqtransport.connect(URI2 + "&trackMessages=true", backend=backend, sleep=lambda s: None,
                              listener=rec) as conn:
        for i in range(5):
            conn.send("/queue/ff", f"old-{i}", receipt=False, idempotency_key=f"old-{i}")
        conn.send("/queue/other", "receipted", idempotency_key="r")  # its receipt proves old-0..4
        conn.send("/queue/ff", "new", receipt=False, idempotency_key="new")
        assert _replayed_keys(backend, a, b, conn, rec) == ["new"]


def test_track_messages_asks_for_a_receipt_every_so_often(backend: MemoryBackend) -> None:
    """Only fire-and-forget traffic: every 64th tracked send carries a receipt, so an
    old message is never re-sent after thousands of later ones."""
    from amqtransport.transports.replay import TRACK_RECEIPT_EVERY

    a, b = two(backend)
    rec = Recorder()
    with amqtransport.connect(URI2 + "&trackMessages=true&maxCacheSize=10000000", backend=backend,
                              sleep=lambda s: None, listener=rec) as conn:
        total = 1000
        for i in range(total):
            conn.send("/queue/ff", f"m{i}", receipt=False, idempotency_key=f"m{i}")
        receipted = [f for f in a.frames("SEND") if f.get("receipt")]
        assert len(receipted) == total // TRACK_RECEIPT_EVERY
        wait_for(lambda: conn.transport.cached_sends < TRACK_RECEIPT_EVERY)  # type: ignore[attr-defined]
        replayed = _replayed_keys(backend, a, b, conn, rec)
        assert replayed == [f"m{i}" for i in range(total - len(replayed), total)]
        assert len(replayed) < TRACK_RECEIPT_EVERY


def test_track_messages_idle_barrier_empties_the_cache(backend: MemoryBackend) -> None:
    a, b = two(backend)
    rec = Recorder()
    with amqtransport.connect(URI2 + "&trackMessages=true", backend=backend, sleep=lambda s: None,
                              listener=rec) as conn:
        for i in range(3):
            conn.send("/queue/ff", f"m{i}", receipt=False, idempotency_key=f"m{i}")
        wait_for(lambda: conn.transport.cached_sends == 0, timeout=5)  # type: ignore[attr-defined]
        # the barrier is an empty transaction: BEGIN, then a receipted ABORT
        begin, abort = a.frames("BEGIN")[-1], a.frames("ABORT")[-1]
        assert begin.get("transaction") == abort.get("transaction") and abort.get("receipt")
        assert a.frames("COMMIT") == []
        assert _replayed_keys(backend, a, b, conn, rec) == []


def test_track_messages_unreceipted_sends_are_still_replayed(backend: MemoryBackend) -> None:
    a, b = two(backend)
    a.hold_receipts = True  # nothing is proven
    rec = Recorder()
    with amqtransport.connect(URI2 + "&trackMessages=true", backend=backend, sleep=lambda s: None,
                              listener=rec) as conn:
        for i in range(100):
            conn.send("/queue/ff", f"m{i}", receipt=False, idempotency_key=f"m{i}")
        time.sleep(1.2)  # the idle barrier goes out but is not answered either
        assert _replayed_keys(backend, a, b, conn, rec) == [f"m{i}" for i in range(100)]
        wait_for(lambda: conn.transport.cached_sends == 0, timeout=5)  # type: ignore[attr-defined]


# -- what a caller needs to recover ------------------------------------------------------------


def test_send_timeout_names_the_idempotency_key(backend: MemoryBackend) -> None:
    a, b = two(backend)
    conn = amqtransport.connect(URI2 + "&timeout=100", backend=backend, sleep=lambda s: time.sleep(0.01))
    try:
        a.up = b.up = False
        a.drop()
        wait_for(lambda: not conn.is_connected)
        with pytest.raises(SendTimeout) as info:
            conn.send("/queue/x", "never", idempotency_key="order-17")
        assert info.value.idempotency_key == "order-17" and "order-17" in str(info.value)
        with pytest.raises(SendTimeout) as info:
            conn.send("/queue/x", "never", receipt=False, idempotency_key="order-18")
        assert info.value.idempotency_key == "order-18"
        # re-sending with the key once a broker is back
        b.up = True
        wait_for(lambda: conn.is_connected, timeout=10)
        conn.send("/queue/x", "again", idempotency_key=info.value.idempotency_key)
        assert [f.get(IDEMPOTENCY_HEADER) for f in b.frames("SEND")] == ["order-18"]
    finally:
        conn.close()


def test_commit_in_flight_across_a_failover_is_in_doubt_with_the_keys(backend: MemoryBackend) -> None:
    """The link dies after the COMMIT was written, before its receipt: the broker may
    have committed. Not "rolled back" (that invites a blind re-send without the keys)."""
    from amqtransport.errors import TransactionInDoubt

    a, b = two(backend)
    rec = Recorder()

    def no_commit_receipt(stream: Any, frame: Any) -> bool:
        if frame.command == "COMMIT":
            a.up = False
            stream.hang_up()  # the broker got it; did it commit? nobody knows
            return True
        return False

    a.on_frame = no_commit_receipt
    with amqtransport.connect(URI2, backend=backend, sleep=lambda s: None, listener=rec) as conn:
        with pytest.raises(TransactionRolledBack) as info:  # old except clauses still catch it
            with conn.transaction() as tx:
                tx.send("/queue/t", "one", idempotency_key="t-1")
                tx.send("/queue/t", "two", idempotency_key="t-2")
        assert isinstance(info.value, TransactionInDoubt)
        assert info.value.keys == ("t-1", "t-2")
        assert "may or may not" in str(info.value)
        assert b.frames("COMMIT") == []  # never replayed blindly
        # the recovery it suggests: the same keys in a new transaction
        with conn.transaction() as tx:
            for key in info.value.keys:
                tx.send("/queue/t", key, idempotency_key=key)
        assert [f.get(IDEMPOTENCY_HEADER) for f in b.frames("SEND")] == ["t-1", "t-2"]


def test_rolled_back_transaction_offers_its_keys(backend: MemoryBackend) -> None:
    from amqtransport.errors import TransactionInDoubt

    a, b = two(backend)
    rec = Recorder()
    with amqtransport.connect(URI2, backend=backend, sleep=lambda s: None, listener=rec) as conn:
        tx = conn.transaction().__enter__()
        tx.send("/queue/t", "one", idempotency_key="r-1")
        a.up = False
        a.drop()
        assert rec.event.wait(5)
        wait_for(lambda: conn.is_connected)
        with pytest.raises(TransactionRolledBack) as info:
            tx.commit()
        assert not isinstance(info.value, TransactionInDoubt)
        assert info.value.keys == ("r-1",)
