"""Memory limits and producer flow control of the embedded broker (real sockets).

A producer that outruns its consumers must be stopped (its SENDs parked, no receipts,
then TCP back-pressure) once ``memory_limit`` is reached, not grow the broker without
bound; a consumer draining the queue releases it, and nothing is lost or duplicated.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from broker_helpers import Raw
from pydantic import ValidationError

from amqtransport.broker import BrokerConfig, EmbeddedBroker
from amqtransport.broker.config import config_from_mapping
from amqtransport.errors import ConfigError
from amqtransport.stomp import Frame, serialize
from amqtransport.testing.wait import wait_for as _wait_for

pytestmark = pytest.mark.timeout(120)

KIB = 1024
MIB = 1024 * 1024
BODY = 10 * KIB


def memory(b: EmbeddedBroker) -> dict[str, Any]:
    m = b.stats()["memory"]
    assert isinstance(m, dict)
    return m


def wait_for(pred: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    _wait_for(pred, timeout, what, interval=0.02)


def send_frame(dest: str, seq: int, receipt: str | None = None) -> bytes:
    headers = {"destination": dest, "seq": str(seq), "persistent": "false"}
    if receipt is not None:
        headers["receipt"] = receipt
    body = (f"{seq:08d}".encode() * (BODY // 8))[:BODY]
    return serialize(Frame.make("SEND", headers, body), "1.2")


class ReceiptReader(threading.Thread):
    """Reads a Raw connection on a thread, collecting receipt ids and ERRORs."""

    def __init__(self, raw: Raw) -> None:
        super().__init__(daemon=True)
        self.raw = raw
        self.receipts: set[str] = set()
        self.errors: list[Frame] = []
        self.stop = False

    def run(self) -> None:
        while not self.stop:
            try:
                f = self.raw.read(timeout=0.5)
            except AssertionError as exc:
                if "closed" in str(exc):
                    return
                continue
            except OSError:
                return
            if f.command == "RECEIPT":
                self.receipts.add(f.get("receipt-id") or "")
            elif f.command == "ERROR":
                self.errors.append(f)


def test_fast_producer_is_blocked_then_released_by_a_consumer(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    limit = 1 * MIB
    b = make_broker(memory_limit=limit, fsync=False)
    n = 2000  # 20 MiB: far more than the limit plus every socket buffer on the way

    prod = Raw(b.port)
    assert prod.connect().command == "CONNECTED"
    reader = ReceiptReader(prod)
    reader.start()
    writer_done = threading.Event()

    def write_all() -> None:
        # the reader thread shares the socket (and its timeout): send with partial writes
        try:
            for i in range(n):
                view = memoryview(send_frame("/queue/fc", i, receipt=f"r{i}"))
                while view:
                    if reader.stop:
                        return
                    try:
                        sent = prod.sock.send(view)
                    except TimeoutError:
                        continue
                    view = view[sent:]
        except OSError:
            return
        writer_done.set()

    writer = threading.Thread(target=write_all, daemon=True)
    writer.start()
    try:
        wait_for(lambda: memory(b)["flow_control"], what="flow control to engage")
        # the producer stalls: receipts stop growing and the writer cannot finish
        wait_for(lambda: len(reader.receipts) > 0, what="first receipts")
        before = -1
        for _ in range(50):  # until two successive looks 0.2 s apart agree
            now = len(reader.receipts)
            if now == before:
                break
            before = now
            time.sleep(0.2)
        assert len(reader.receipts) < n
        assert not writer_done.is_set(), "the producer was never blocked"
        m = memory(b)
        assert m["flow_control"] is True
        assert m["blocked_producers"] == 1
        assert m["usage"] <= limit + 2 * BODY, m
        assert b.stats()["queues"]["/queue/fc"]["depth"] <= limit // BODY + 2  # type: ignore[index]

        # a consumer drains the queue: the producer is released, every message arrives once
        cons = Raw(b.port)
        assert cons.connect().command == "CONNECTED"
        cons.send(Frame.make("SUBSCRIBE", {"id": "s", "destination": "/queue/fc", "ack": "auto"}))
        seen: list[int] = []
        while len(seen) < n:
            f = cons.read(timeout=30)
            assert f.command == "MESSAGE", f
            seq = int(f.get("seq") or -1)
            assert f.body[:8] == f"{seq:08d}".encode()
            seen.append(seq)
        assert writer_done.wait(30)
        wait_for(lambda: len(reader.receipts) == n, what="every receipt")
        assert sorted(seen) == list(range(n))
        assert seen == list(range(n))  # one producer, one queue: in order too
        assert reader.errors == []
        m = memory(b)
        assert m["usage"] == 0 and m["flow_control"] is False and m["blocked_producers"] == 0
        assert m["peak"] <= limit + 2 * BODY, m
        assert m["engaged"] >= 1
    finally:
        reader.stop = True
        prod.sock.close()
        writer.join(10)
        reader.join(10)


def test_connection_that_produces_and_consumes_is_not_deadlocked(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    limit = 1 * MIB
    b = make_broker(memory_limit=limit, fsync=False)
    c = Raw(b.port)
    assert c.connect().command == "CONNECTED"
    c.send(
        Frame.make(
            "SUBSCRIBE",
            {
                "id": "s",
                "destination": "/queue/mix",
                "ack": "client-individual",
                "activemq.prefetchSize": "100000",
            },
        )
    )
    n = 150  # 1.5 MiB: over the limit while nothing is acked
    for i in range(n):
        c.send_raw(send_frame("/queue/mix", i, receipt=f"m{i}"))
    receipts: set[str] = set()
    pending: list[Frame] = []
    # phase 1: read without acking until the broker holds this connection's SENDs
    deadline = time.monotonic() + 30
    while not memory(b)["flow_control"] or len(pending) + len(receipts) < 2 * (
        limit // (BODY + 600)
    ):
        assert time.monotonic() < deadline, (len(receipts), len(pending), memory(b))
        f = c.read(timeout=30)
        if f.command == "RECEIPT":
            receipts.add(f.get("receipt-id") or "")
        else:
            assert f.command == "MESSAGE", f
            pending.append(f)
    assert memory(b)["flow_control"] is True
    assert len(receipts) < n
    # phase 2: ACKs on the same connection (behind its parked SENDs) free memory
    got: list[int] = []
    for f in pending:
        got.append(int(f.get("seq") or -1))
        c.send(Frame.make("ACK", {"id": f.get("ack") or ""}))
    while len(got) < n or len(receipts) < n:
        f = c.read(timeout=30)
        if f.command == "RECEIPT":
            receipts.add(f.get("receipt-id") or "")
        else:
            assert f.command == "MESSAGE", f
            got.append(int(f.get("seq") or -1))
            c.send(Frame.make("ACK", {"id": f.get("ack") or ""}))
    assert sorted(got) == list(range(n))
    assert receipts == {f"m{i}" for i in range(n)}
    c.send(Frame.make("DISCONNECT", {"receipt": "bye"}))
    assert c.read().get("receipt-id") == "bye"
    wait_for(lambda: memory(b)["usage"] == 0, what="all memory released")
    assert memory(b)["peak"] <= limit + 2 * BODY


def test_send_fail_if_no_space_answers_an_error_naming_the_limit(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    limit = 64 * KIB
    b = make_broker(memory_limit=limit, send_fail_if_no_space=True, fsync=False)
    c = Raw(b.port)
    assert c.connect().command == "CONNECTED"
    accepted = 0
    error: Frame | None = None
    for i in range(50):
        c.send_raw(send_frame("/queue/full", i, receipt=f"f{i}"))
        f = c.read()
        if f.command == "ERROR":
            error = f
            break
        assert f.command == "RECEIPT" and f.get("receipt-id") == f"f{i}"
        accepted += 1
    assert error is not None, "no ERROR although the queue exceeds memory_limit"
    assert f"memory_limit={limit}" in (error.get("message") or "")
    assert "send_fail_if_no_space" in (error.get("message") or "")
    assert error.get("receipt-id") == f"f{accepted}"
    assert c.closed()
    assert accepted * BODY >= limit * 0.9
    # the accepted ones are all there, exactly once
    cons = Raw(b.port)
    cons.connect()
    cons.send(Frame.make("SUBSCRIBE", {"id": "s", "destination": "/queue/full"}))
    seqs = [int(cons.read().get("seq") or -1) for _ in range(accepted)]
    assert seqs == list(range(accepted))
    wait_for(lambda: memory(b)["usage"] == 0, what="memory released")
    # and once below the low-water mark, sends are accepted again
    again = Raw(b.port)
    again.connect()
    again.send_raw(send_frame("/queue/full", 999, receipt="again"))
    assert again.read().get("receipt-id") == "again"


def test_destination_limit_blocks_only_that_destination(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    b = make_broker(memory_limit=64 * MIB, destination_memory_limit=100 * KIB, fsync=False)
    p = Raw(b.port)
    p.connect()
    reader = ReceiptReader(p)
    reader.start()
    try:
        for i in range(30):  # 300 KiB to a destination allowed 100 KiB
            p.send_raw(send_frame("/queue/small", i, receipt=f"s{i}"))
        wait_for(
            lambda: memory(b)["blocked_destinations"] == ["/queue/small"],
            what="destination blocked",
        )
        time.sleep(0.3)
        assert len(reader.receipts) < 30
        assert memory(b)["flow_control"] is False
        other = Raw(b.port)
        other.connect()
        other.send_raw(send_frame("/queue/other", 1, receipt="o1"))
        assert other.read().get("receipt-id") == "o1"
        cons = Raw(b.port)
        cons.connect()
        cons.send(Frame.make("SUBSCRIBE", {"id": "s", "destination": "/queue/small"}))
        seqs = [int(cons.read().get("seq") or -1) for _ in range(30)]
        assert seqs == list(range(30))
        wait_for(lambda: len(reader.receipts) == 30, what="all receipts")
        stats = b.stats()
        assert stats["queues"]["/queue/other"]["memory"] > BODY  # type: ignore[index]
        assert memory(b)["blocked_destinations"] == []
    finally:
        reader.stop = True
        p.sock.close()
        reader.join(10)


def test_memory_accounting_survives_restart_and_dead_lettering(
    make_broker: Callable[..., EmbeddedBroker], tmp_path: Any
) -> None:
    b = make_broker(memory_limit=64 * MIB, max_redeliveries=0, data_dir=tmp_path / "d")
    p = Raw(b.port)
    p.connect()
    for i in range(5):
        f = Frame.make(
            "SEND",
            {"destination": "/queue/r", "persistent": "true", "receipt": f"p{i}"},
            b"x" * 1000,
        )
        p.send(f)
        assert p.read().get("receipt-id") == f"p{i}"
    usage = memory(b)["usage"]
    assert 5 * 1000 < usage < 5 * 2000
    b.stop()
    b2 = make_broker(memory_limit=64 * MIB, max_redeliveries=0, data_dir=tmp_path / "d")
    assert memory(b2)["usage"] == 0  # recovered messages wait paged, on disk ...
    assert b2.stats()["queues"]["/queue/r"]["paged"] == 5  # type: ignore[index]
    c = Raw(b2.port)
    c.connect()
    c.send(
        Frame.make("SUBSCRIBE", {"id": "s", "destination": "/queue/r", "ack": "client-individual"})
    )
    m = c.read()
    assert memory(b2)["usage"] == usage  # ... and are charged again once a consumer needs them
    for i in range(5):
        m = m if i == 0 else c.read()
        c.send(Frame.make("NACK", {"id": m.get("ack") or ""}))  # one delivery allowed: to the DLQ
    wait_for(lambda: b2.stats()["queues"].get("/queue/DLQ.r", {}).get("depth") == 5, what="DLQ")  # type: ignore[attr-defined]
    st = b2.stats()
    assert st["queues"]["/queue/r"]["memory"] == 0  # type: ignore[index]
    assert st["queues"]["/queue/DLQ.r"]["memory"] > 5000  # type: ignore[index]
    d = Raw(b2.port)
    d.connect()
    d.send(Frame.make("SUBSCRIBE", {"id": "s", "destination": "/queue/DLQ.r"}))
    for _ in range(5):
        assert d.read().command == "MESSAGE"
    wait_for(lambda: memory(b2)["usage"] == 0, what="memory released")


def test_config_keys_are_validated() -> None:
    cfg = BrokerConfig()
    assert cfg.memory_limit == 256 * MIB
    assert cfg.destination_memory_limit == 0 and cfg.send_fail_if_no_space is False
    assert 0 < cfg.memory_low_water < 1
    for key, value in (
        ("memory_limit", 10),
        ("memory_low_water", 1.5),
        ("destination_memory_limit", -1),
    ):
        with pytest.raises(ConfigError) as info:
            config_from_mapping({key: value})
        assert f"'{key}'" in str(info.value)
    with pytest.raises(ConfigError) as info:
        config_from_mapping({"memory_limt": 1 * MIB})
    assert "memory_limt" in str(info.value)
    with pytest.raises(ValidationError):
        BrokerConfig(send_fail_if_no_space="maybe")  # type: ignore[arg-type]
    ok = config_from_mapping({"broker": {"memory_limit": 1 * MIB, "send_fail_if_no_space": True}})
    assert ok.memory_limit == MIB and ok.send_fail_if_no_space


def test_our_client_blocks_in_send_and_survives_heartbeats_while_parked(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    import amqtransport

    limit = 1 * MIB
    b = make_broker(memory_limit=limit, fsync=False)
    n = 300  # 3 MiB, sent one at a time (each send waits for its receipt)
    sent = 0
    interrupted: list[object] = []
    done = threading.Event()

    class Events:
        def on_interrupted(self, error: object) -> None:
            interrupted.append(error)

    def produce() -> None:
        nonlocal sent
        with amqtransport.connect(b.uri, heartbeat=(200, 200), listener=Events()) as conn:
            for i in range(n):  # non-persistent: persistent ones would be paged, not parked
                conn.send("/queue/client", b"y" * BODY, headers={"seq": str(i)}, persistent=False)
                sent += 1
        done.set()

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    try:
        wait_for(lambda: memory(b)["blocked_producers"] == 1, what="the producer to be parked")
        stuck_at = sent
        time.sleep(1.5)  # several heart-beat intervals: the parked client must not be dropped
        assert sent == stuck_at < n
        assert not done.is_set() and interrupted == []
        cons = Raw(b.port)
        cons.connect()
        cons.send(Frame.make("SUBSCRIBE", {"id": "s", "destination": "/queue/client"}))
        seqs = [int(cons.read(timeout=30).get("seq") or -1) for _ in range(n)]
        assert done.wait(30)
        assert seqs == list(range(n)) and interrupted == []
        assert memory(b)["peak"] <= limit + 2 * BODY
    finally:
        t.join(30)


def test_expired_messages_nobody_consumes_release_parked_producers(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    b = make_broker(memory_limit=64 * KIB, fsync=False)
    p = Raw(b.port)
    p.connect()
    n = 20  # 200 KiB into a 64 KiB limit, with no consumer at all
    expires = str(int((time.time() + 0.5) * 1000))
    for i in range(n):
        f = Frame.make(
            "SEND",
            {"destination": "/queue/exp", "expires": expires, "receipt": f"e{i}"},
            b"z" * BODY,
        )
        p.send(f)
    got = {p.read(timeout=30).get("receipt-id") for _ in range(n)}  # released by the expiry sweep
    assert got == {f"e{i}" for i in range(n)}
    st = b.stats()
    assert st["expired"] >= 1  # type: ignore[operator]
    assert memory(b)["peak"] <= 64 * KIB + 2 * BODY


def test_transactional_sends_wait_too_and_commit_once_released(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    b = make_broker(memory_limit=64 * KIB, fsync=False)
    p = Raw(b.port)
    p.connect()
    for i in range(10):  # 100 KiB: the last ones are parked
        p.send_raw(send_frame("/queue/tx", i, receipt=f"p{i}"))
    wait_for(lambda: memory(b)["blocked_producers"] == 1, what="producer parked")
    t = Raw(b.port)
    t.connect()
    t.send(Frame.make("BEGIN", {"transaction": "tx1", "receipt": "b"}))
    assert t.read().get("receipt-id") == "b"
    t.send_raw(
        serialize(
            Frame.make(
                "SEND", {"destination": "/queue/tx", "transaction": "tx1", "seq": "100"}, b"t"
            ),
            "1.2",
        )
    )
    t.send(Frame.make("COMMIT", {"transaction": "tx1", "receipt": "c"}))
    with pytest.raises(AssertionError, match="no frame"):
        t.read(timeout=0.5)  # the COMMIT waits behind the parked transactional SEND
    cons = Raw(b.port)
    cons.connect()
    cons.send(Frame.make("SUBSCRIBE", {"id": "s", "destination": "/queue/tx"}))
    seqs = sorted(int(cons.read(timeout=30).get("seq") or -1) for _ in range(11))
    assert seqs == [*range(10), 100]
    assert t.read(timeout=30).get("receipt-id") == "c"
    assert {p.read(timeout=30).get("receipt-id") for _ in range(10)} == {f"p{i}" for i in range(10)}
