"""The broker driven by stomp.py (an independent client) and raw sockets."""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from broker_helpers import Raw, StompPy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqtransport.broker import EmbeddedBroker
from amqtransport.broker.config import hash_password
from amqtransport.stomp import Frame

pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------------- queues & topics


def test_queue_send_receive_with_receipts_and_headers(broker: EmbeddedBroker) -> None:
    c = StompPy(broker.port)
    c.conn.subscribe("/queue/a", id="s1", ack="auto")
    rids = [
        c.send("/queue/a", f"m{i}", **{"amq-idempotency-key": f"k{i}", "x-custom": "v:1"})
        for i in range(5)
    ]
    c.wait_receipts(rids)
    got = c.get_n(5)
    assert [m.body for m in got] == [f"m{i}" for i in range(5)]
    h = got[0].headers
    assert h["destination"] == "/queue/a"
    assert h["subscription"] == "s1"
    assert h["ack"] == h["message-id"] and h["message-id"].startswith("ID:")
    assert h["amq-idempotency-key"] == "k0"
    assert h["x-custom"] == "v:1"  # escaped on the wire, unescaped by the client
    assert "redelivered" not in h
    c.close()


def test_queue_round_robin_between_consumers(broker: EmbeddedBroker) -> None:
    a, b, p = StompPy(broker.port), StompPy(broker.port), StompPy(broker.port)
    a.conn.subscribe("/queue/rr", id="1", ack="auto")
    b.conn.subscribe("/queue/rr", id="1", ack="auto", headers={"receipt": "sub-b"})
    b.wait_receipts(["sub-b"])
    p.wait_receipts([p.send("/queue/rr", f"m{i}") for i in range(10)])
    ga = a.get_n(5)
    gb = b.get_n(5)
    assert sorted(m.body for m in ga + gb) == sorted(f"m{i}" for i in range(10))
    assert [m.body for m in ga] == [f"m{i}" for i in range(0, 10, 2)]
    a.none(0.2)
    b.none(0.1)
    for c in (a, b, p):
        c.close()


def test_topic_fan_out_and_no_persistence_without_subscribers(broker: EmbeddedBroker) -> None:
    a, b, p = StompPy(broker.port), StompPy(broker.port), StompPy(broker.port)
    p.wait_receipts([p.send("/topic/t", "before anyone listened")])
    a.conn.subscribe("/topic/t", id="1")
    b.conn.subscribe("/topic/t", id="2", headers={"receipt": "sb"})
    b.wait_receipts(["sb"])
    time.sleep(0.05)
    p.wait_receipts([p.send("/topic/t", "hello all")])
    assert a.get().body == "hello all"
    assert b.get().body == "hello all"
    a.none(0.2)
    assert broker.stats()["store"]["live_messages"] == 0  # type: ignore[index]
    for c in (a, b, p):
        c.close()


def test_topic_wildcards(broker: EmbeddedBroker) -> None:
    c = StompPy(broker.port)
    c.conn.subscribe("/topic/prices.>", id="1")
    c.conn.subscribe("/topic/prices.*.eu", id="2", headers={"receipt": "s"})
    c.wait_receipts(["s"])
    c.wait_receipts([c.send("/topic/prices.stock.eu", "x"), c.send("/topic/prices.stock.us", "y")])
    got = sorted((m.headers["subscription"], m.body) for m in c.get_n(3))
    assert got == [("1", "x"), ("1", "y"), ("2", "x")]
    c.close()


# ---------------------------------------------------------------------- ack modes


def test_client_ack_is_cumulative(broker: EmbeddedBroker) -> None:
    p = StompPy(broker.port)
    p.wait_receipts([p.send("/queue/c", f"m{i}") for i in range(3)])
    c = StompPy(broker.port)
    c.conn.subscribe("/queue/c", id="1", ack="client")
    got = c.get_n(3)
    c.conn.ack(got[1].headers["ack"], receipt="ack1")  # acks m0 and m1
    c.wait_receipts(["ack1"])
    c.close()
    c2 = StompPy(broker.port)
    c2.conn.subscribe("/queue/c", id="1", ack="client")
    again = c2.get()
    assert again.body == "m2"
    assert again.headers["redelivered"] == "true"
    assert again.headers["amq-delivery-count"] == "2"
    c2.none(0.2)
    for x in (p, c2):
        x.close()


def test_client_individual_ack_and_redelivery_on_disconnect(broker: EmbeddedBroker) -> None:
    p = StompPy(broker.port)
    p.wait_receipts([p.send("/queue/ci", f"m{i}") for i in range(3)])
    c = StompPy(broker.port)
    c.conn.subscribe("/queue/ci", id="1", ack="client-individual")
    got = c.get_n(3)
    c.conn.ack(got[1].headers["ack"], receipt="a")
    c.wait_receipts(["a"])
    c.close()
    c2 = StompPy(broker.port)
    c2.conn.subscribe("/queue/ci", id="1", ack="client-individual")
    again = c2.get_n(2)
    assert [m.body for m in again] == ["m0", "m2"]
    assert all(m.headers["redelivered"] == "true" for m in again)
    for x in (p, c2):
        x.close()


def test_nack_redelivers_with_count_then_dead_letter_queue(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    broker = make_broker(max_redeliveries=2)
    c = StompPy(broker.port)
    c.conn.subscribe("/queue/n", id="1", ack="client-individual")
    c.wait_receipts([c.send("/queue/n", "poison")])
    counts = []
    for _ in range(3):
        m = c.get()
        counts.append(m.headers.get("amq-delivery-count", "1"))
        c.conn.nack(m.headers["ack"])
    assert counts == ["1", "2", "3"]
    c.none(0.3)  # not redelivered a 4th time: it went to the DLQ
    d = StompPy(broker.port)
    d.conn.subscribe("/queue/DLQ.n", id="1", ack="client-individual")
    dead = d.get()
    assert dead.body == "poison"
    assert dead.headers["destination"] == "/queue/DLQ.n"
    assert dead.headers["original-destination"] == "/queue/n"
    d.conn.ack(dead.headers["ack"], receipt="x")
    d.wait_receipts(["x"])
    for x in (c, d):
        x.close()


def test_prefetch_limits_unacked_messages(broker: EmbeddedBroker) -> None:
    p = StompPy(broker.port)
    p.wait_receipts([p.send("/queue/pf", f"m{i}") for i in range(4)])
    a = StompPy(broker.port)
    a.conn.subscribe(
        "/queue/pf", id="1", ack="client-individual", headers={"activemq.prefetchSize": "1"}
    )
    first = a.get()
    a.none(0.3)  # one unacked message: no credit for more
    b = StompPy(broker.port)
    b.conn.subscribe(
        "/queue/pf", id="1", ack="client-individual", headers={"activemq.prefetchSize": "10"}
    )
    assert [m.body for m in b.get_n(3)] == ["m1", "m2", "m3"]
    a.conn.ack(first.headers["ack"])
    for x in (p, a, b):
        x.close()


# ---------------------------------------------------------------------- transactions


def test_transactions_commit_and_abort(broker: EmbeddedBroker) -> None:
    c = StompPy(broker.port)
    c.conn.subscribe("/queue/tx", id="1", ack="client-individual")
    c.conn.begin("t1")
    c.conn.send("/queue/tx", "aborted", transaction="t1")
    c.conn.abort("t1")
    c.conn.begin("t2")
    c.conn.send("/queue/tx", "committed-1", transaction="t2", headers={"persistent": "true"})
    c.conn.send("/queue/tx", "committed-2", transaction="t2")
    c.none(0.2)  # nothing before the commit
    c.conn.commit("t2", headers={"receipt": "commit"})
    c.wait_receipts(["commit"])
    got = c.get_n(2)
    assert [m.body for m in got] == ["committed-1", "committed-2"]
    # acks inside an aborted transaction are undone: the messages come back
    c.conn.begin("t3")
    for m in got:
        c.conn.ack(m.headers["ack"], transaction="t3")
    c.conn.abort("t3")
    back = c.get_n(2)
    assert [m.body for m in back] == ["committed-1", "committed-2"]
    assert back[0].headers["redelivered"] == "true"
    c.conn.begin("t4")
    for m in back:
        c.conn.ack(m.headers["ack"], transaction="t4")
    c.conn.commit("t4", headers={"receipt": "c4"})
    c.wait_receipts(["c4"])
    c.none(0.2)
    assert broker.stats()["store"]["live_messages"] == 0  # type: ignore[index]
    c.close()


def test_commit_of_unknown_transaction_is_an_error(broker: EmbeddedBroker) -> None:
    r = Raw(broker.port)
    r.connect()
    r.send(Frame.make("COMMIT", {"transaction": "nope", "receipt": "x"}))
    err = r.read()
    assert err.command == "ERROR" and "nope" in (err.get("message") or "")
    assert err.get("receipt-id") == "x"
    assert r.closed()


# ---------------------------------------------------------------------- receipts, versions, errors


def test_receipts_for_every_frame_and_disconnect(broker: EmbeddedBroker) -> None:
    r = Raw(broker.port)
    connected = r.connect({"receipt": "c0"})
    assert connected.command == "CONNECTED" and connected.get("version") == "1.2"
    assert r.read().get("receipt-id") == "c0"
    frames = [
        Frame.make("SUBSCRIBE", {"destination": "/queue/r", "id": "9", "receipt": "r1"}),
        Frame.make("BEGIN", {"transaction": "t", "receipt": "r2"}),
        Frame.make("SEND", {"destination": "/queue/r", "transaction": "t", "receipt": "r3"}, b"x"),
        Frame.make("COMMIT", {"transaction": "t", "receipt": "r4"}),
    ]
    for f in frames:
        r.send(f)
    seen = []
    while len(seen) < 4:
        f = r.read()
        if f.command == "RECEIPT":
            seen.append(f.get("receipt-id"))
        else:
            assert f.command == "MESSAGE" and f.body == b"x"
    assert sorted(seen) == ["r1", "r2", "r3", "r4"]
    r.send(Frame.make("UNSUBSCRIBE", {"id": "9", "receipt": "r5"}))
    f = r.read()
    while f.command == "MESSAGE":
        f = r.read()
    assert f.get("receipt-id") == "r5"
    r.send(Frame.make("DISCONNECT", {"receipt": "bye"}))
    assert r.read().get("receipt-id") == "bye"
    assert r.closed()


@pytest.mark.parametrize(
    ("accept", "expected"), [(None, "1.0"), ("1.0,1.1", "1.1"), ("1.1,1.2", "1.2")]
)
def test_version_negotiation(broker: EmbeddedBroker, accept: str | None, expected: str) -> None:
    r = Raw(broker.port)
    headers = {"host": "x"} if accept is None else {"accept-version": accept, "host": "x"}
    r.send(Frame.make("CONNECT", headers))
    f = r.read()
    assert f.command == "CONNECTED" and f.get("version") == expected
    r.close()


def test_stomp_10_and_11_clients_work(broker: EmbeddedBroker) -> None:
    for version in ("1.0", "1.1"):
        c = StompPy(broker.port, version=version)
        dest = f"/queue/v{version}"
        c.conn.subscribe(dest, id="1", ack="client")
        c.wait_receipts([c.send(dest, "line\nbreak")])
        m = c.get()
        assert m.body == "line\nbreak"
        c.conn.ack(m.headers["message-id"], "1")
        c.close()


def test_unsupported_version_is_refused(broker: EmbeddedBroker) -> None:
    r = Raw(broker.port)
    r.send(Frame.make("CONNECT", {"accept-version": "2.0", "host": "x"}))
    f = r.read()
    assert f.command == "ERROR" and "1.2" in (f.get("message") or "")
    assert r.closed()


def test_frame_before_connect_is_refused(broker: EmbeddedBroker) -> None:
    r = Raw(broker.port)
    r.send(Frame.make("SEND", {"destination": "/queue/x"}, b"sneaky"))
    f = r.read()
    assert f.command == "ERROR" and "CONNECT" in (f.get("message") or "")
    assert r.closed()


def test_bad_destination_names_the_problem(broker: EmbeddedBroker) -> None:
    r = Raw(broker.port)
    r.connect()
    r.send(Frame.make("SEND", {"destination": "nowhere", "receipt": "1"}, b"x"))
    f = r.read()
    assert f.command == "ERROR" and "/queue/" in (f.get("message") or "")
    assert f.get("receipt-id") == "1"


# ---------------------------------------------------------------------- heart-beats


def test_broker_sends_heartbeats_and_drops_a_silent_client(broker: EmbeddedBroker) -> None:
    r = Raw(broker.port)
    f = r.connect({"heart-beat": "200,200"})
    assert f.get("heart-beat") == "200,200"
    # we send nothing: the broker must beat to us, then drop us after 2 x 200 ms
    t0 = time.monotonic()
    error = r.read(timeout=5)
    assert error.command == "ERROR" and "heart-beat timeout" in (error.get("message") or "")
    # about the connection, not a frame of ours: a failover client must not count it as a refusal
    assert error.get("amq-connection-ended") == "true"
    assert r.closed(timeout=5)
    assert time.monotonic() - t0 < 4
    assert r.heartbeats >= 1


def test_a_client_that_beats_stays_connected(broker: EmbeddedBroker) -> None:
    c = StompPy(broker.port, heartbeats=(200, 200))
    time.sleep(1.2)
    assert c.conn.is_connected()
    c.wait_receipts([c.send("/queue/hb", "still here")])
    c.close()


# ---------------------------------------------------------------------- dedupe


def test_duplicate_sends_are_receipted_but_not_enqueued(broker: EmbeddedBroker) -> None:
    c = StompPy(broker.port)
    key = {"amq-idempotency-key": "same"}
    rids = [c.send("/queue/d", "one", **key), c.send("/queue/d", "two", **key)]
    rids.append(c.send("/queue/d", "artemis", _AMQ_DUPL_ID="other"))
    rids.append(c.send("/queue/d", "artemis again", _AMQ_DUPL_ID="other"))
    rids.append(c.send("/queue/d", "np", persistent=False, **{"amq-idempotency-key": "np"}))
    rids.append(c.send("/queue/d", "np again", persistent=False, **{"amq-idempotency-key": "np"}))
    c.wait_receipts(rids)
    c.conn.subscribe("/queue/d", id="1")
    assert [m.body for m in c.get_n(3)] == ["one", "artemis", "np"]
    c.none(0.3)
    c.close()


# ---------------------------------------------------------------------- advisories & durable subs


def test_consumer_advisories(broker: EmbeddedBroker) -> None:
    watcher = StompPy(broker.port)
    consumer = StompPy(broker.port)
    consumer.conn.subscribe("/queue/adv", id="early", headers={"receipt": "e"})
    consumer.wait_receipts(["e"])
    watcher.conn.subscribe("/topic/ActiveMQ.Advisory.Consumer.Queue.adv", id="w")
    first = watcher.get()  # the current count is announced to a new watcher
    assert first.headers["consumerCount"] == "1"
    consumer.conn.subscribe("/queue/adv", id="second")
    assert watcher.get().headers["consumerCount"] == "2"
    consumer.conn.unsubscribe("early")
    m = watcher.get()
    assert m.headers["consumerCount"] == "1"
    assert json.loads(m.body)["destination"] == "/queue/adv"
    consumer.close()
    assert watcher.get().headers["consumerCount"] == "0"
    watcher.close()


def test_durable_topic_subscription_keeps_messages_while_offline(broker: EmbeddedBroker) -> None:
    sub_headers = {"activemq.subscriptionName": "audit"}
    c = StompPy(broker.port, client_id="app-1")
    c.conn.subscribe(
        "/topic/orders", id="1", ack="client-individual", headers={**sub_headers, "receipt": "s"}
    )
    c.wait_receipts(["s"])
    c.close()
    p = StompPy(broker.port)
    p.wait_receipts([p.send("/topic/orders", f"o{i}") for i in range(3)])
    c2 = StompPy(broker.port, client_id="app-1")
    c2.conn.subscribe("/topic/orders", id="1", ack="client-individual", headers=sub_headers)
    got = c2.get_n(3)
    assert [m.body for m in got] == ["o0", "o1", "o2"]
    assert got[0].headers["destination"] == "/topic/orders"
    for m in got:
        c2.conn.ack(m.headers["ack"])
    c2.conn.unsubscribe("1", headers={**sub_headers, "receipt": "u"})  # removes the durable sub
    c2.wait_receipts(["u"])
    p.wait_receipts([p.send("/topic/orders", "after unsubscribe")])
    assert broker.stats()["store"]["live_messages"] == 0  # type: ignore[index]
    for x in (p, c2):
        x.close()


def test_durable_subscription_needs_client_id(broker: EmbeddedBroker) -> None:
    r = Raw(broker.port)
    r.connect()
    r.send(
        Frame.make(
            "SUBSCRIBE", {"destination": "/topic/x", "id": "1", "activemq.subscriptionName": "s"}
        )
    )
    f = r.read()
    assert f.command == "ERROR" and "client-id" in (f.get("message") or "")


# ---------------------------------------------------------------------- security & limits


def test_authentication(make_broker: Callable[..., EmbeddedBroker]) -> None:
    broker = make_broker(users={"alice": "secret", "bob": hash_password("hunter2")})
    ok = StompPy(broker.port, login="alice", passcode="secret")
    ok.wait_receipts([ok.send("/queue/auth", "x")])
    ok.close()
    ok2 = StompPy(broker.port, login="bob", passcode="hunter2")
    ok2.close()
    for login, passcode in (
        ("alice", "wrong"),
        ("mallory", "secret"),
        (None, None),
        ("bob", "sha256"),
    ):
        r = Raw(broker.port)
        hdrs = {} if login is None else {"login": login, "passcode": passcode or ""}
        f = r.connect(hdrs)
        assert f.command == "ERROR", (login, f)
        assert "authentication failed" in (f.get("message") or "")
        assert r.closed()


def test_oversized_frame_gets_error_and_others_carry_on(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    broker = make_broker(max_frame_size=4096)
    good = StompPy(broker.port)
    good.conn.subscribe("/queue/big", id="1")
    r = Raw(broker.port)
    r.connect()
    r.send_raw(b"SEND\ndestination:/queue/big\n\n" + b"x" * 10000 + b"\x00")
    f = r.read()
    assert f.command == "ERROR" and "max_frame_size" in (f.get("message") or "")
    assert r.closed()
    good.wait_receipts([good.send("/queue/big", "small")])
    assert good.get().body == "small"
    good.close()


def test_too_many_headers_and_connections(make_broker: Callable[..., EmbeddedBroker]) -> None:
    broker = make_broker(max_headers=10, max_connections=3)
    r = Raw(broker.port)
    r.connect()
    hdrs = [("destination", "/queue/h")] + [(f"h{i}", "v") for i in range(20)]
    r.send(Frame.make("SEND", hdrs, b"x"))
    f = r.read()
    assert f.command == "ERROR" and "max_headers" in (f.get("message") or "")
    assert r.closed()
    keep = [Raw(broker.port) for _ in range(3)]
    for k in keep:
        assert k.connect().command == "CONNECTED"
    extra = Raw(broker.port)
    f = extra.read()
    assert f.command == "ERROR" and "max_connections" in (f.get("message") or "")
    assert extra.closed()
    for k in keep:
        k.close()


def test_fuzzed_garbage_from_one_client_while_another_keeps_working(
    broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    good = StompPy(broker.port)
    good.conn.subscribe("/queue/fz", id="1")
    stop = threading.Event()
    rng = random.Random(1234)
    errors: list[str] = []
    seeds = [
        b"SEND\ndestination:/queue/fz\ncontent-length:99999999\n\n",
        b"CONNECT\naccept-version:1.2\n\n\x00SEND\n\\q:bad\n\n\x00",
        b"\x00\x00\x00",
        b"SUBSCRIBE\n" + b"h:" * 5000,
        b"CONNECT\nheart-beat:abc\n\n\x00",
        bytes(range(256)),
    ]

    def fuzz() -> None:
        n = 0
        while not stop.is_set() and n < 150:
            n += 1
            try:
                s = socket.create_connection(("127.0.0.1", broker.port), timeout=2)
                payload = (
                    rng.choice(seeds)
                    if rng.random() < 0.5
                    else rng.randbytes(rng.randrange(1, 3000))
                )
                if rng.random() < 0.5:
                    payload = b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00" + payload
                s.sendall(payload)
                s.settimeout(0.5)
                try:
                    while s.recv(65536):
                        pass
                except OSError:
                    pass
                s.close()
            except OSError as exc:
                errors.append(repr(exc))

    threads = [threading.Thread(target=fuzz) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(30):
            good.wait_receipts([good.send("/queue/fz", f"m{i}")])
            assert good.get().body == f"m{i}"
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors[:3]
    assert good.conn.is_connected()
    bad_logs = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert bad_logs == []  # garbage is the client's problem: no broker-side error or traceback
    assert any("sent invalid STOMP" in r.getMessage() for r in caplog.records)
    good.close()
    after = StompPy(broker.port)
    after.close()


# ---------------------------------------------------------------------- restart (in process) and back-pressure


def test_durable_subscription_and_dlq_survive_a_restart(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Path
) -> None:
    data = tmp_path / "shared"
    b1 = make_broker(data_dir=data, max_redeliveries=0)
    c = StompPy(b1.port, client_id="svc")
    c.conn.subscribe(
        "/topic/ev", id="1", headers={"activemq.subscriptionName": "keep", "receipt": "s"}
    )
    c.wait_receipts(["s"])
    c.close()
    deadline = time.monotonic() + 10  # the broker must have seen the disconnect (else: a delivery)
    while b1.call(lambda: bool(b1.server.core.durable_active)) and time.monotonic() < deadline:
        time.sleep(0.02)
    p = StompPy(b1.port)
    p.wait_receipts([p.send("/topic/ev", "while offline"), p.send("/queue/poison", "bad")])
    k = StompPy(b1.port)
    k.conn.subscribe("/queue/poison", id="1", ack="client-individual")
    k.conn.nack(k.get().headers["ack"], receipt="n")  # max_redeliveries=0: straight to the DLQ
    k.wait_receipts(["n"])
    for x in (p, k):
        x.close()
    b1.stop()
    b2 = make_broker(data_dir=data)
    c2 = StompPy(b2.port, client_id="svc")
    c2.conn.subscribe("/topic/ev", id="1", headers={"activemq.subscriptionName": "keep"})
    assert c2.get().body == "while offline"
    c2.conn.subscribe("/queue/DLQ.poison", id="2")
    dead = c2.get()
    assert dead.body == "bad" and dead.headers["original-destination"] == "/queue/poison"
    c2.conn.subscribe("/queue/poison", id="3")
    c2.none(0.3)
    c2.close()


def test_a_consumer_that_does_not_read_does_not_stall_the_queue(broker: EmbeddedBroker) -> None:
    stuck = Raw(broker.port)
    stuck.connect()
    stuck.send(
        Frame.make(
            "SUBSCRIBE", {"destination": "/queue/bp", "id": "1", "ack": "auto", "receipt": "s"}
        )
    )
    assert stuck.read().get("receipt-id") == "s"
    p = StompPy(broker.port)
    body = "y" * 8000
    n = 3000  # 24 MB: far more than the stuck socket's buffers and our write buffer hold
    p.wait_receipts([p.send("/queue/bp", body, persistent=False) for _ in range(n)], timeout=60)
    reader = StompPy(broker.port)
    reader.conn.subscribe("/queue/bp", id="1")
    got = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            reader.messages.get(timeout=1)
        except Exception:  # noqa: BLE001 - queue.Empty: the reader has everything it will get
            break
        got += 1
    depth = broker.stats()["queues"]["/queue/bp"]["depth"]  # type: ignore[index]
    assert depth == 0
    assert got > 0  # the stuck consumer was skipped once its socket filled up
    stuck_got = 0
    while stuck_got + got < n:
        f = stuck.read(timeout=10)
        assert f.command == "MESSAGE"
        stuck_got += 1
    assert stuck_got + got == n  # every message went to exactly one of them
    for x in (p, reader):
        x.close()
    stuck.close()


# ---------------------------------------------------------------------- frame-level details


def test_binary_body_with_nul_and_escaped_headers_round_trip(broker: EmbeddedBroker) -> None:
    r = Raw(broker.port)
    r.connect()
    r.send(Frame.make("SUBSCRIBE", {"destination": "/queue/bin", "id": "s:1"}))
    body = bytes(range(256)) * 4
    r.send(
        Frame.make(
            "SEND",
            [
                ("destination", "/queue/bin"),
                ("weird", "a:b\\c\nd\re"),
                ("weird", "second loses"),
                ("receipt", "1"),
            ],
            body,
        )
    )
    frames = [r.read(), r.read()]
    msg = next(f for f in frames if f.command == "MESSAGE")
    assert msg.body == body
    assert msg.get("weird") == "a:b\\c\nd\re"
    assert msg.get_all("weird") == ["a:b\\c\nd\re"]  # repeated header: the first one wins
    assert msg.get("subscription") == "s:1"
    assert any(f.command == "RECEIPT" for f in frames)


def test_stomp_10_subscribe_without_id_and_unsubscribe_by_destination(
    broker: EmbeddedBroker,
) -> None:
    r = Raw(broker.port, version="1.0")
    r.send(Frame.make("CONNECT", {}))
    assert r.read().get("version") == "1.0"
    r.send(Frame.make("SUBSCRIBE", {"destination": "/queue/ten", "ack": "client"}))
    r.send(Frame.make("SEND", {"destination": "/queue/ten"}, b"one"))
    m = r.read()
    assert m.command == "MESSAGE" and m.get("subscription") == "/queue/ten" and m.get("ack") is None
    r.send(Frame.make("ACK", {"message-id": m.get("message-id") or "", "receipt": "a"}))
    assert r.read().get("receipt-id") == "a"
    r.send(Frame.make("UNSUBSCRIBE", {"destination": "/queue/ten", "receipt": "u"}))
    assert r.read().get("receipt-id") == "u"
    r.send(Frame.make("NACK", {"message-id": "x"}))
    f = r.read()
    assert f.command == "ERROR" and "1.0" in (f.get("message") or "")


def test_duplicate_subscription_id_is_an_error(broker: EmbeddedBroker) -> None:
    r = Raw(broker.port)
    r.connect()
    r.send(Frame.make("SUBSCRIBE", {"destination": "/queue/a", "id": "1"}))
    r.send(Frame.make("SUBSCRIBE", {"destination": "/queue/b", "id": "1"}))
    f = r.read()
    assert f.command == "ERROR" and "already in use" in (f.get("message") or "")


def test_expired_messages_are_not_delivered(broker: EmbeddedBroker) -> None:
    c = StompPy(broker.port)
    past = str(int(time.time() * 1000) - 1000)
    future = str(int(time.time() * 1000) + 60000)
    c.wait_receipts(
        [c.send("/queue/exp", "stale", expires=past), c.send("/queue/exp", "fresh", expires=future)]
    )
    c.conn.subscribe("/queue/exp", id="1")
    assert c.get().body == "fresh"
    c.none(0.3)
    c.close()


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(garbage=st.binary(min_size=1, max_size=2000), connect_first=st.booleans())
def test_hypothesis_garbage_never_hurts_the_broker(
    broker: EmbeddedBroker, garbage: bytes, connect_first: bool
) -> None:
    s = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    try:
        if connect_first:
            s.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00")
        s.sendall(garbage)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(2)
        try:
            while s.recv(65536):
                pass
        except OSError:
            pass
    finally:
        s.close()
    probe = Raw(broker.port)
    assert probe.connect().command == "CONNECTED"
    probe.close()


def test_abort_after_unsubscribe_still_returns_the_messages(broker: EmbeddedBroker) -> None:
    c = StompPy(broker.port)
    c.conn.subscribe("/queue/late", id="1", ack="client-individual")
    c.wait_receipts([c.send("/queue/late", "keep me")])
    m = c.get()
    c.conn.begin("t")
    c.conn.ack(m.headers["ack"], transaction="t")
    c.conn.unsubscribe("1")  # the queue is empty and consumer-less now
    c.conn.abort("t", headers={"receipt": "ab"})
    c.wait_receipts(["ab"])
    c.conn.subscribe("/queue/late", id="2")
    again = c.get()
    assert again.body == "keep me" and again.headers["redelivered"] == "true"
    c.close()


def test_stomp_command_and_connect_timeout(make_broker: Callable[..., EmbeddedBroker]) -> None:
    broker = make_broker(connect_timeout_ms=300)
    r = Raw(broker.port)
    r.send(Frame.make("STOMP", {"accept-version": "1.2", "host": "x"}))
    assert r.read().command == "CONNECTED"
    idle = Raw(broker.port)  # connects and says nothing
    f = idle.read(timeout=5)
    assert f.command == "ERROR" and "CONNECT" in (f.get("message") or "")
    assert idle.closed()
    r.close()


def test_slow_topic_subscriber_loses_only_its_own_oldest_messages(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    broker = make_broker(topic_backlog_limit=5)
    slow = Raw(broker.port)
    slow.connect()
    slow.send(
        Frame.make(
            "SUBSCRIBE",
            {
                "destination": "/topic/fast",
                "id": "1",
                "ack": "client",
                "activemq.prefetchSize": "1",
                "receipt": "s",
            },
        )
    )
    assert slow.read().get("receipt-id") == "s"
    fast = StompPy(broker.port)
    fast.conn.subscribe("/topic/fast", id="1", headers={"receipt": "f"})
    fast.wait_receipts(["f"])
    fast.wait_receipts([fast.send("/topic/fast", f"m{i}", persistent=False) for i in range(20)])
    assert [m.body for m in fast.get_n(20)] == [f"m{i}" for i in range(20)]
    first = slow.read()  # its one prefetched message; the backlog holds the newest 5
    assert first.body == b"m0"
    slow.send(Frame.make("ACK", {"id": first.get("ack") or ""}))
    rest = []
    for _ in range(5):
        f = slow.read()
        rest.append(f.body.decode())
        slow.send(Frame.make("ACK", {"id": f.get("ack") or ""}))
    assert rest == [f"m{i}" for i in range(15, 20)]
    fast.close()
    slow.close()


def test_receipt_for_a_persistent_send_waits_for_fsync(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    real = os.fdatasync
    gate = threading.Event()
    entered = threading.Event()

    def slow_fdatasync(fd: int) -> None:
        entered.set()
        gate.wait(10)
        real(fd)

    c = StompPy(broker.port)
    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    try:
        nonpersistent = c.send("/queue/fs", "np", persistent=False)
        c.wait_receipts([nonpersistent])  # no disk involved: at once
        rid = c.send("/queue/fs", "p")
        assert entered.wait(5)  # the journal writer is inside fdatasync now
        time.sleep(0.3)
        assert rid not in c.receipts  # ... and the receipt has not gone out
    finally:
        gate.set()
    c.wait_receipts([rid])
    c.close()


def test_non_persistent_messages_never_touch_the_journal(broker: EmbeddedBroker) -> None:
    def records() -> int:
        store = broker.stats()["store"]
        assert isinstance(store, dict)
        return int(store["records"])

    c = StompPy(broker.port)
    c.conn.subscribe("/queue/np", id="1", ack="client-individual")
    before = records()
    c.wait_receipts([c.send("/queue/np", f"m{i}", persistent=False) for i in range(50)])
    for m in c.get_n(50):
        c.conn.ack(m.headers["ack"])
    c.wait_receipts([c.send("/queue/np", "last", persistent=False)])
    c.get()
    assert records() == before
    c.wait_receipts([c.send("/queue/np", "persistent one")])
    assert records() == before + 1
    c.close()
