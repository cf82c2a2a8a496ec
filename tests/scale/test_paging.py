"""Paged queues (broker/dispatch/queues.py, registry.py, store/pages.py) at small scale: with a
window of a few messages, everything a consumer sees behaves as without paging across
the in-memory / on-disk boundary -- order, prefetch, redelivery, DLQ, expiry, NACK,
transactions, durable topic subscriptions, wildcard consumers -- and persistent
producers never wait for memory."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from amqtransport.broker import BrokerConfig, EmbeddedBroker
from amqtransport.testing.broker_process import BrokerProcess

from .scale_helpers import Raw

WINDOW = 4


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Callable[..., EmbeddedBroker]]:
    started: list[EmbeddedBroker] = []

    def make(**overrides: Any) -> EmbeddedBroker:
        cfg = BrokerConfig(**{"page_window": WINDOW, "fsync": False, **overrides})
        b = EmbeddedBroker(port=0, data_dir=tmp_path / "data", config=cfg)
        started.append(b)
        return b.start()

    yield make
    for b in started:
        b.stop()


def queue_stats(b: EmbeddedBroker, name: str) -> dict[str, Any]:
    return dict(b.stats()["queues"].get(name, {}))  # type: ignore[attr-defined]


def send(c: Raw, dest: str, n: int, *, first: int = 0, persistent: bool = True, **headers: str) -> None:
    for i in range(first, first + n):
        c.receipt("SEND", {"destination": dest, "persistent": "true" if persistent else "false", "seq": str(i),
                           **headers}, b"%d" % i)


def consume(c: Raw, n: int) -> list[Any]:
    got = [c.read() for _ in range(n)]
    assert all(f.command == "MESSAGE" for f in got), [f.headers for f in got]
    return got


def ack_each(c: Raw, n: int) -> list[Any]:
    """Consume ``n`` messages, acking each as it comes."""
    got = consume(c, 1) if n else []
    for _ in range(n - 1):
        c.send("ACK", {"id": got[-1].get("ack")})
        got += consume(c, 1)
    if got:
        c.send("ACK", {"id": got[-1].get("ack")})
    return got


def seqs(frames: list[Any]) -> list[int]:
    return [int(f.get("seq")) for f in frames]


def test_order_and_prefetch_across_the_boundary(broker: Callable[..., EmbeddedBroker]) -> None:
    b = broker()
    p = Raw(b.port)
    send(p, "/queue/q", 10)
    send(p, "/queue/q", 5, first=10, persistent=False)  # non-persistent, behind the paged ones
    send(p, "/queue/q", 10, first=15)
    st = queue_stats(b, "/queue/q")
    assert st["depth"] == 25 and st["paged"] == 25 - WINDOW
    c = Raw(b.port)
    c.send("SUBSCRIBE", {"destination": "/queue/q", "id": "s", "ack": "client-individual",
                         "activemq.prefetchSize": "3"})
    got: list[Any] = []
    while len(got) < 25:
        batch = consume(c, 3 if len(got) <= 21 else 25 - len(got))
        with pytest.raises(TimeoutError):  # never more than the prefetch in the consumer's hands
            c.read(timeout=0.2)
        got += batch
        for f in batch:
            c.send("ACK", {"id": f.get("ack")})
    assert seqs(got) == list(range(25))
    assert queue_stats(b, "/queue/q")["depth"] == 0


def test_redelivery_nack_and_the_dlq_across_the_boundary(broker: Callable[..., EmbeddedBroker]) -> None:
    b = broker(max_redeliveries=1)
    p = Raw(b.port)
    send(p, "/queue/r", 12)
    c = Raw(b.port)
    c.send("SUBSCRIBE", {"destination": "/queue/r", "id": "s", "ack": "client-individual",
                         "activemq.prefetchSize": "1"})
    got: list[Any] = []
    while len(got) < 12:
        f = consume(c, 1)[0]
        got.append(f)
        c.send("NACK", {"id": f.get("ack")})  # back to the front, redelivered at once ...
        g = consume(c, 1)[0]
        assert g.get("seq") == f.get("seq") and g.get("redelivered") == "true", g.headers
        assert g.get("amq-delivery-count") == "2"
        c.send("NACK", {"id": g.get("ack")})  # ... then, its second failed delivery, to the DLQ
    assert seqs(got) == list(range(12))
    deadline = time.monotonic() + 10
    while queue_stats(b, "/queue/DLQ.r").get("depth") != 12:
        assert time.monotonic() < deadline, queue_stats(b, "/queue/DLQ.r")
        time.sleep(0.02)
    assert queue_stats(b, "/queue/DLQ.r")["paged"] == 12 - WINDOW  # the DLQ pages too
    d = Raw(b.port)
    d.send("SUBSCRIBE", {"destination": "/queue/DLQ.r", "id": "d"})
    dead = consume(d, 12)
    assert seqs(dead) == list(range(12))
    assert all(f.get("original-destination") == "/queue/r" for f in dead)


def test_expired_paged_messages_are_dropped_when_their_turn_comes(broker: Callable[..., EmbeddedBroker]) -> None:
    b = broker()
    p = Raw(b.port)
    past = str(int(time.time() * 1000) - 1000)
    for i in range(12):
        extra = {"expires": past} if i % 3 == 0 else {}
        send(p, "/queue/e", 1, first=i, **extra)
    c = Raw(b.port)
    c.send("SUBSCRIBE", {"destination": "/queue/e", "id": "s"})
    assert seqs(consume(c, 8)) == [i for i in range(12) if i % 3]
    with pytest.raises(TimeoutError):
        c.read(timeout=0.3)
    assert b.stats()["expired"] == 4  # type: ignore[index]


def test_transactions_across_the_boundary(broker: Callable[..., EmbeddedBroker]) -> None:
    b = broker()
    p = Raw(b.port)
    p.send("BEGIN", {"transaction": "t1"})
    for i in range(10):
        p.send("SEND", {"destination": "/queue/t", "persistent": "true", "seq": str(i), "transaction": "t1"}, b"x")
    p.receipt("COMMIT", {"transaction": "t1"})
    assert queue_stats(b, "/queue/t")["paged"] == 10 - WINDOW
    c = Raw(b.port)
    c.send("SUBSCRIBE", {"destination": "/queue/t", "id": "s", "ack": "client-individual",
                         "activemq.prefetchSize": "20"})
    got = consume(c, 10)
    c.send("BEGIN", {"transaction": "a"})
    for f in got[:6]:
        c.send("ACK", {"id": f.get("ack"), "transaction": "a"})
    c.receipt("ABORT", {"transaction": "a"})  # the acks are undone: redelivered, in order
    again = consume(c, 6)
    assert seqs(again) == list(range(6)) and all(f.get("redelivered") == "true" for f in again)
    c.send("BEGIN", {"transaction": "k"})
    for f in [*again, *got[6:]]:
        c.send("ACK", {"id": f.get("ack"), "transaction": "k"})
    c.receipt("COMMIT", {"transaction": "k"})
    assert queue_stats(b, "/queue/t")["depth"] == 0 and b.stats()["store"]["live_messages"] == 0  # type: ignore[index]


def test_durable_subscription_and_wildcard_consumers_page(broker: Callable[..., EmbeddedBroker]) -> None:
    b = broker()
    s = Raw(b.port, **{"client-id": "c1"})
    s.receipt("SUBSCRIBE", {"destination": "/topic/news", "id": "d", "activemq.subscriptionName": "n"})
    s.close()  # offline: its messages pile up in its durable queue
    p = Raw(b.port)
    send(p, "/topic/news", 15)
    send(p, "/queue/w.a", 7)
    send(p, "/queue/w.b", 7, first=100)
    assert queue_stats(b, "durable:c1:n")["paged"] == 15  # offline: paged from the first (Registry.offline_durable)
    s = Raw(b.port, **{"client-id": "c1"})
    s.send("SUBSCRIBE", {"destination": "/topic/news", "id": "d", "activemq.subscriptionName": "n"})
    assert seqs(consume(s, 15)) == list(range(15))
    w = Raw(b.port)
    w.send("SUBSCRIBE", {"destination": "/queue/w.>", "id": "w", "activemq.prefetchSize": "2",
                         "ack": "client-individual"})
    got = ack_each(w, 14)
    a = [int(f.get("seq")) for f in got if f.get("destination") == "/queue/w.a"]
    bb = [int(f.get("seq")) for f in got if f.get("destination") == "/queue/w.b"]
    assert a == list(range(7)) and bb == list(range(100, 107))  # each queue in order


def test_persistent_producers_never_wait_for_memory(broker: Callable[..., EmbeddedBroker]) -> None:
    """With a 64 KiB memory limit, 2 MiB of persistent messages are accepted (they wait
    paged) while memory stays at the limit; a non-persistent producer is still parked."""
    b = broker(memory_limit=64 * 1024, page_window=1000)
    p = Raw(b.port)
    for i in range(1000):
        p.receipt("SEND", {"destination": "/queue/big", "persistent": "true", "seq": str(i)}, b"m" * 2000)
    mem = b.stats()["memory"]  # type: ignore[index]
    assert mem["peak"] <= 64 * 1024 + 4096 and not mem["flow_control"]
    assert queue_stats(b, "/queue/big")["paged"] > 950
    n = Raw(b.port)
    n.send("SEND", {"destination": "/queue/np", "receipt": "np0"}, b"n" * 70 * 1024)  # over the limit at once
    assert n.read().get("receipt-id") == "np0"
    n.send("SEND", {"destination": "/queue/np", "receipt": "np1"}, b"n")
    with pytest.raises(TimeoutError):  # parked by flow control: memory is over its limit
        n.read(timeout=0.5)
    c = Raw(b.port)
    c.send("SUBSCRIBE", {"destination": "/queue/big", "id": "s", "ack": "client-individual",
                         "activemq.prefetchSize": "2"})
    assert seqs(ack_each(c, 1000)) == list(range(1000))
    # while memory is short, paged messages come back only as the consumer takes them:
    # the drain never held more than the limit (a window of 1000 x 2 KB would be 2 MB)
    assert b.stats()["memory"]["peak"] <= 64 * 1024 + 70 * 1024 + 8192  # type: ignore[index]


def test_acks_of_paged_messages_survive_restarts_and_segments_are_compacted(tmp_path: Path) -> None:
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f"page_window = {WINDOW}\nsegment_size = 65536\ncompact_interval_ms = 50\n"
                   "checkpoint_interval = 65536\n")
    with BrokerProcess(tmp_path / "d", args=["--config", str(cfg)], log_dir=tmp_path) as bp:
        p = Raw(bp.port)
        for i in range(400):
            p.send("SEND", {"destination": "/queue/k", "persistent": "true", "seq": str(i)}, b"k" * 1000)
        p.receipt("SEND", {"destination": "/queue/k", "persistent": "true", "seq": "400"}, b"last")
        p.close()
        segments = len(list((tmp_path / "d" / "journal").glob("seg-*.log")))
        assert segments >= 6

        def take(n: int) -> tuple[Raw, list[Any]]:
            c = Raw(bp.port)
            c.send("SUBSCRIBE", {"destination": "/queue/k", "id": "s", "ack": "client-individual"})
            got = consume(c, n)
            for f in got:
                c.send("ACK", {"id": f.get("ack")})
            return c, got

        bp.kill()  # a crash: recovery from the newest checkpoint and the tail
        bp.start()
        c, got = take(300)
        c.close()
        bp.kill()
        bp.start()
        c, rest = take(101)
        with pytest.raises(TimeoutError):
            c.read(timeout=0.5)
        assert seqs(got) + seqs(rest) == list(range(401))
        c.close()
        deadline = time.monotonic() + 10
        while len(list((tmp_path / "d" / "journal").glob("seg-*.log"))) > 2:  # consumed segments go
            assert time.monotonic() < deadline, sorted((tmp_path / "d" / "journal").iterdir())
            time.sleep(0.05)


def test_admin_takes_reach_every_kind_of_paged_message(tmp_path: Path) -> None:
    """The store's list of a destination holds persistent messages (positions) and
    non-persistent ones queued among them (in memory, in their place): an operator's
    take by id finds both, leaves the rest in order, and only the persistent ones are
    live in the store."""
    from amqtransport.broker.dispatch.message import Message
    from amqtransport.broker.store import MessageStore

    s = MessageStore(tmp_path / "j", fsync=False)
    s.open()
    try:
        for i in range(6):
            m = Message(id=f"m{i}", destination="/queue/a", headers=(), body=b"%d" % i, persistent=i % 2 == 0)
            if m.persistent:
                s.add(m)
            assert s.page_out(m)
        assert s.paged_count("/queue/a") == 6 and s.count == 3 and not s.resident
        stranger = Message(id="x", destination="/queue/a", headers=(), body=b"", persistent=True)
        assert not s.page_out(stranger)  # persistent but not in the store: never a position
        taken = s.take_ids("/queue/a", ["m3", "m2", "nope"])
        assert [m.id for m in taken] == ["m2", "m3"]
        assert [m.id for m in s.take("/queue/a", 10)] == ["m0", "m1", "m4", "m5"]
        assert s.count == 3 and s.paged_count("/queue/a") == 0
    finally:
        s.close()
