"""The duplicate window is scoped per destination: the same idempotency key sent to two
destinations is two messages; a repeat to the same destination is one. Broker with real
sockets, a real ``amq broker run`` process killed with SIGKILL, and the store (compaction,
dead-lettering, the replication record stream)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from broker_helpers import StompPy

from amqtransport.broker import EmbeddedBroker
from amqtransport.broker.dispatch.message import Message
from amqtransport.broker.store import Keys, MessageStore, Record
from amqtransport.testing.broker_process import BrokerProcess

KEY = "amq-idempotency-key"


def bodies(c: StompPy, n: int, quiet: float = 0.4) -> list[str]:
    got = [m.body for m in c.get_n(n)]
    c.none(quiet)
    return got


def test_same_key_to_two_queues_lands_in_both(make_broker: Callable[..., EmbeddedBroker]) -> None:
    b = make_broker()
    p = StompPy(b.port)
    rids = [
        p.send("/queue/a", "to-a", **{KEY: "k1"}),
        p.send("/queue/b", "to-b", **{KEY: "k1"}),
        p.send("/queue/a", "to-a again", **{KEY: "k1"}),  # a real repeat: dropped
        p.send("/queue/b", "to-b again", persistent=False, **{KEY: "k1"}),  # non-persistent too
    ]
    p.wait_receipts(rids)  # every SEND is receipted, repeats included
    for dest, want in (("/queue/a", ["to-a"]), ("/queue/b", ["to-b"])):
        c = StompPy(b.port)
        c.conn.subscribe(dest, id="1", ack="auto")
        assert bodies(c, 1) == want, dest
        c.close()
    assert b.stats()["duplicates"] == 2
    p.close()


def test_transaction_scopes_keys_per_destination(make_broker: Callable[..., EmbeddedBroker]) -> None:
    b = make_broker()
    c = StompPy(b.port)
    c.conn.subscribe("/queue/>", id="1", ack="auto")
    p = StompPy(b.port)
    p.conn.begin("t1")
    for dest in ("/queue/x", "/queue/y", "/queue/x"):
        p.conn.send(dest, dest, headers={"persistent": "true", KEY: "same"}, transaction="t1")
    p.conn.commit("t1", receipt="c1")
    p.wait_receipts(["c1"])
    assert sorted(bodies(c, 2)) == ["/queue/x", "/queue/y"]
    p.close()
    c.close()


def test_scopes_survive_kill_9_and_a_topic_key_is_its_topics(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "data", log_dir=tmp_path) as bp:
        sub = StompPy(bp.port, client_id="c1")
        sub.conn.subscribe("/topic/t", id="d", ack="auto", headers={"activemq.subscriptionName": "s"}, receipt="s")
        sub.wait_receipts(["s"])
        sub.close()
        p = StompPy(bp.port)
        p.wait_receipts([p.send(d, f"{d} 1", **{KEY: "k"}) for d in ("/queue/a", "/queue/b", "/topic/t")])
        p.close()
        bp.kill()
        bp.start()
        p = StompPy(bp.port)
        # after recovery: repeats are dropped per destination, a new destination accepts the key
        p.wait_receipts([p.send(d, f"{d} 2", **{KEY: "k"}) for d in ("/queue/a", "/queue/b", "/topic/t", "/queue/c")])
        p.close()
        for dest, want in (("/queue/a", "/queue/a 1"), ("/queue/b", "/queue/b 1"), ("/queue/c", "/queue/c 2")):
            c = StompPy(bp.port)
            c.conn.subscribe(dest, id="1", ack="auto")
            assert bodies(c, 1) == [want], dest
            c.close()
        d = StompPy(bp.port, client_id="c1")
        d.conn.subscribe("/topic/t", id="d", ack="auto", headers={"activemq.subscriptionName": "s"})
        assert bodies(d, 1) == ["/topic/t 1"]
        d.close()
        assert "Traceback" not in bp.log_text()


# ---------------------------------------------------------------------- store level

T0 = time.time()


def msg(i: int, dest: str, key: str = "", body: bytes = b"x" * 200) -> Message:
    return Message(f"m{i}", dest, (), body, key, T0 + i / 1000, persistent=True)


def open_store(path: Path, **kw: object) -> MessageStore:
    s = MessageStore(path, **kw)  # type: ignore[arg-type]
    s.open()
    return s


def test_compaction_carries_each_key_with_its_destination(tmp_path: Path) -> None:
    s = open_store(tmp_path, segment_size=2048)
    s.add(msg(0, "/queue/a", "k"))
    s.add(msg(1, "/queue/b", "k2"))
    s.ack(["m0", "m1"])
    for i in range(2, 30):  # fill and roll segments so the first one can go
        s.add(msg(i, "/queue/z"))
        s.ack([f"m{i}"])
    s.flush()
    s.compact(force=True)
    s.flush()
    assert not (tmp_path / "seg-0000000001.log").exists()
    s.close()
    s2 = open_store(tmp_path)
    assert s2.is_duplicate("/queue/a", "k") and s2.is_duplicate("/queue/b", "k2")
    assert not s2.is_duplicate("/queue/b", "k") and not s2.is_duplicate("/queue/a", "k2")
    s2.close()


def test_a_dead_lettered_message_keeps_its_key_under_the_queue_it_was_sent_to(tmp_path: Path) -> None:
    s = open_store(tmp_path, segment_size=4096)
    s.add(msg(0, "/queue/a", "poison"))
    s.move("m0", "/queue/DLQ.a")
    for i in range(1, 200):  # m0 pins the first segment among many consumed messages
        s.add(msg(i, "/queue/z", body=b"y" * 100))
        s.ack([f"m{i}"])
    s.flush()
    s.compact(force=True, relocate=100)  # m0's Enq is re-written into the head
    s.flush()
    assert s.relocated == 1
    s.close()
    s2 = open_store(tmp_path)
    assert s2.live["m0"].destination == "/queue/DLQ.a"
    assert s2.is_duplicate("/queue/a", "poison")
    assert not s2.is_duplicate("/queue/DLQ.a", "poison")
    s2.close()


def test_a_replica_scopes_keys_like_its_master(tmp_path: Path) -> None:
    """The slave applies the master's record stream (snapshot, then every record)."""
    master = open_store(tmp_path / "m")
    master.add(msg(0, "/queue/a", "before"))
    streamed: list[bytes] = []

    class Tap:
        def on_record(self, record: Record, payload: bytes, segment: int) -> None:
            streamed.append(payload)

    snapshot = list(master.snapshot())
    master.add_listener(Tap())
    master.add(msg(1, "/queue/a", "k"))
    master.add_many([msg(2, "durable:c:s"), msg(3, "durable:c:t")], key=("/topic/t", "k", T0))
    slave = open_store(tmp_path / "s")
    slave.import_records(snapshot)
    slave.import_payloads(streamed)
    slave.flush()
    for s in (master, slave):
        assert s.is_duplicate("/queue/a", "before") and not s.is_duplicate("/queue/b", "before")
        assert s.is_duplicate("/queue/a", "k") and s.is_duplicate("/topic/t", "k")
        assert not s.is_duplicate("/queue/b", "k")
    slave.close()
    master.close()
    again = open_store(tmp_path / "s")
    assert again.is_duplicate("/topic/t", "k") and not again.is_duplicate("durable:c:s", "k")
    again.close()


def test_keys_of_an_older_journal_match_every_destination(tmp_path: Path) -> None:
    s = open_store(tmp_path)
    s.import_records([Keys((("", "old", time.time()),))])  # "": how an unscoped key decodes
    assert s.is_duplicate("/queue/a", "old") and s.is_duplicate("/topic/x", "old")
    s.close()
