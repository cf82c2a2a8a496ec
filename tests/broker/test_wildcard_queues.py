"""Wildcard queue consumers (``/queue/a.>``, ``/queue/a.*.c``) on the embedded broker, over real sockets."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from broker_helpers import Raw, StompPy

from amqtransport.broker import EmbeddedBroker
from amqtransport.stomp import Frame

pytestmark = pytest.mark.timeout(60)


def _subscribe(c: StompPy, dest: str, sub_id: str = "w", ack: str = "auto", **headers: str) -> None:
    rid = c.receipt_id()
    c.conn.subscribe(dest, id=sub_id, ack=ack, headers={**headers, "receipt": rid})
    c.wait_receipts([rid])


def test_existing_and_later_matching_queues_are_delivered_not_others(broker: EmbeddedBroker) -> None:
    p = StompPy(broker.port)
    p.wait_receipts([p.send("/queue/events.a", "early-a"), p.send("/queue/other.a", "other")])
    c = StompPy(broker.port)
    _subscribe(c, "/queue/events.>")
    first = c.get()
    assert (first.body, first.headers["destination"]) == ("early-a", "/queue/events.a")
    assert first.headers["subscription"] == "w"
    # queues created after the SUBSCRIBE are read too; non-matching ones are not
    p.wait_receipts([p.send("/queue/events.b.deep", "later-b"), p.send("/queue/eventsx", "no"),
                     p.send("/queue/other.b", "no")])
    later = c.get()
    assert (later.body, later.headers["destination"]) == ("later-b", "/queue/events.b.deep")
    c.none(0.3)
    depths = {k: v["depth"] for k, v in broker.stats()["queues"].items()}  # type: ignore[union-attr]
    assert depths["/queue/other.a"] == 1 and depths["/queue/eventsx"] == 1 and depths["/queue/other.b"] == 1
    assert "/queue/events.>" not in depths  # the wildcard is not a queue of its own
    for x in (p, c):
        x.close()


# (pattern, queue, matched?) -- ActiveMQ 5 semantics: '*' one segment, '>' the rest
# (ActiveMQ 5.17's PrefixDestinationFilter also matches 'a' itself with 'a.>').
TABLE = [
    ("/queue/a.*", "/queue/a.b", True),
    ("/queue/a.*", "/queue/a.b.c", False),
    ("/queue/a.*", "/queue/a", False),
    ("/queue/a.*.c", "/queue/a.x.c", True),
    ("/queue/a.*.c", "/queue/a.x.d", False),
    ("/queue/*.b", "/queue/z.b", True),
    ("/queue/a.>", "/queue/a.b", True),
    ("/queue/a.>", "/queue/a.b.c.d", True),
    ("/queue/a.>", "/queue/a", True),
    ("/queue/a.>", "/queue/ab.c", False),
    ("/queue/a.>", "/queue/b.a", False),
    ("/queue/>", "/queue/anything.at.all", True),
    ("/queue/a.*", "/topic/a.b", False),
]


@pytest.mark.parametrize(("pattern", "dest", "matched"), TABLE)
def test_wildcard_semantics(broker: EmbeddedBroker, pattern: str, dest: str, matched: bool) -> None:
    c = StompPy(broker.port)
    _subscribe(c, pattern)
    c.wait_receipts([c.send(dest, "x")])
    if matched:
        assert c.get().headers["destination"] == dest
    else:
        c.none(0.3)
    c.close()


def test_client_individual_acks_and_redelivery_after_disconnect(broker: EmbeddedBroker) -> None:
    p = StompPy(broker.port)
    p.wait_receipts([p.send("/queue/jobs.a", "a0"), p.send("/queue/jobs.b", "b0"), p.send("/queue/jobs.a", "a1")])
    c = StompPy(broker.port)
    _subscribe(c, "/queue/jobs.*", ack="client-individual")
    got = {m.body: m for m in c.get_n(3)}
    assert {b: m.headers["destination"] for b, m in got.items()} == {
        "a0": "/queue/jobs.a", "b0": "/queue/jobs.b", "a1": "/queue/jobs.a"}
    c.conn.ack(got["a0"].headers["ack"], receipt="ack")
    c.wait_receipts(["ack"])
    c.close()
    # unacked b0 and a1 go back to their own queues, redelivered to a plain consumer of each
    qa, qb = StompPy(broker.port), StompPy(broker.port)
    _subscribe(qa, "/queue/jobs.a", ack="client-individual")
    _subscribe(qb, "/queue/jobs.b", ack="client-individual")
    a, b = qa.get(), qb.get()
    assert (a.body, a.headers["redelivered"], a.headers["amq-delivery-count"]) == ("a1", "true", "2")
    assert (b.body, b.headers["redelivered"]) == ("b0", "true")
    qa.none(0.2)
    for m, conn in ((a, qa), (b, qb)):
        conn.conn.ack(m.headers["ack"], receipt="x")
        conn.wait_receipts(["x"])
    queues = broker.stats()["queues"]
    assert queues["/queue/jobs.a"]["dequeued"] == 2  # type: ignore[index]
    assert queues["/queue/jobs.b"]["dequeued"] == 1  # type: ignore[index]
    for x in (p, qa, qb):
        x.close()


def test_nack_redelivers_then_dead_letters_to_the_real_queues_dlq(
    make_broker: Callable[..., EmbeddedBroker],
) -> None:
    broker = make_broker(max_redeliveries=1)
    c = StompPy(broker.port)
    _subscribe(c, "/queue/n.*", ack="client-individual")
    c.wait_receipts([c.send("/queue/n.x", "poison")])
    counts = []
    for _ in range(2):
        m = c.get()
        assert m.headers["destination"] == "/queue/n.x"
        counts.append(m.headers.get("amq-delivery-count", "1"))
        c.conn.nack(m.headers["ack"])
    assert counts == ["1", "2"]
    c.none(0.3)  # the DLQ (/queue/DLQ.n.x) does not match n.*
    d = StompPy(broker.port)
    _subscribe(d, "/queue/DLQ.>")
    dead = d.get()
    assert (dead.headers["destination"], dead.headers["original-destination"]) == ("/queue/DLQ.n.x", "/queue/n.x")
    for x in (c, d):
        x.close()


def test_prefetch_is_per_subscription_across_matched_queues(broker: EmbeddedBroker) -> None:
    p = StompPy(broker.port)
    p.wait_receipts([p.send(f"/queue/pf.{q}", f"{q}{i}") for q in "abc" for i in range(2)])
    c = StompPy(broker.port)
    _subscribe(c, "/queue/pf.>", ack="client-individual", **{"activemq.prefetchSize": "2"})
    first = c.get_n(2)
    c.none(0.3)  # two unacked in all, whichever queues they came from
    seen = [m.headers["destination"] for m in first]
    for _ in range(4):
        c.conn.ack(first[-1].headers["ack"])
        first.append(c.get())
        seen.append(first[-1].headers["destination"])
    c.none(0.3)
    assert sorted(m.body for m in first) == ["a0", "a1", "b0", "b1", "c0", "c1"]
    # attaching fills the credit from the first queue; then each freed slot goes to the
    # next queue in turn (a queue that was just served moves to the back): b, c, b, c
    assert seen == ["/queue/pf.a", "/queue/pf.a", "/queue/pf.b", "/queue/pf.c", "/queue/pf.b", "/queue/pf.c"]
    for x in (p, c):
        x.close()


def test_two_wildcard_consumers_share_round_robin(broker: EmbeddedBroker) -> None:
    a, b = StompPy(broker.port), StompPy(broker.port)
    _subscribe(a, "/queue/rr.>")
    _subscribe(b, "/queue/rr.*")
    p = StompPy(broker.port)
    p.wait_receipts([p.send("/queue/rr.one", f"m{i}") for i in range(10)])
    got_a = [m.body for m in a.get_n(5)]
    got_b = [m.body for m in b.get_n(5)]
    a.none(0.2)
    b.none(0.2)
    assert sorted(got_a + got_b) == sorted(f"m{i}" for i in range(10))
    assert got_a == [f"m{i}" for i in range(0, 10, 2)]  # strict alternation
    for x in (p, a, b):
        x.close()


def test_unsubscribe_detaches_from_all_and_advisories_count_the_wildcard(broker: EmbeddedBroker) -> None:
    p = StompPy(broker.port)
    p.wait_receipts([p.send("/queue/adv.a", "a")])
    watcher = StompPy(broker.port)
    _subscribe(watcher, "/topic/ActiveMQ.Advisory.Consumer.Queue.adv.>", sub_id="adv")
    c = StompPy(broker.port)
    _subscribe(c, "/queue/adv.*", ack="client-individual")
    assert c.get().body == "a"
    count = watcher.get()
    assert (json.loads(count.body)["destination"], count.headers["consumerCount"]) == ("/queue/adv.a", "1")
    p.wait_receipts([p.send("/queue/adv.b", "b")])  # a new queue: the wildcard attaches (count 1)
    count = watcher.get()
    assert (json.loads(count.body)["destination"], count.headers["consumerCount"]) == ("/queue/adv.b", "1")
    assert c.get().body == "b"
    assert broker.stats()["queues"]["/queue/adv.b"]["consumers"] == 1  # type: ignore[index]
    rid = c.receipt_id()
    c.conn.unsubscribe("w", headers={"receipt": rid})
    c.wait_receipts([rid])
    after = {json.loads(m.body)["destination"]: m.headers["consumerCount"] for m in watcher.get_n(2)}
    assert after == {"/queue/adv.a": "0", "/queue/adv.b": "0"}
    p.wait_receipts([p.send("/queue/adv.c", "c")])
    c.none(0.3)  # detached: nothing more, and its two unacked messages went back
    depths = {k: v["depth"] for k, v in broker.stats()["queues"].items()}  # type: ignore[union-attr]
    assert (depths["/queue/adv.a"], depths["/queue/adv.b"], depths["/queue/adv.c"]) == (1, 1, 1)
    for x in (p, c, watcher):
        x.close()


@pytest.mark.parametrize("dest", ["/queue/events.>", "/queue/a.*.c"])
def test_send_to_a_wildcard_queue_is_an_error(broker: EmbeddedBroker, dest: str) -> None:
    r = Raw(broker.port)
    r.connect()
    r.send(Frame.make("SEND", {"destination": dest, "receipt": "r1"}, b"x"))
    err = r.read()
    assert err.command == "ERROR"
    assert dest in err.get("message", "") and "wildcard" in err.get("message", "")
    r.close()
    # also inside a transaction: refused at SEND time, nothing half-committed
    r = Raw(broker.port)
    r.connect()
    r.send(Frame.make("BEGIN", {"transaction": "t"}))
    r.send(Frame.make("SEND", {"destination": dest, "transaction": "t", "receipt": "r2"}, b"x"))
    err = r.read()
    assert err.command == "ERROR" and "wildcard" in err.get("message", "")
    r.close()
    assert broker.stats()["sent"] == 0  # type: ignore[index]


def test_a_literal_star_inside_a_segment_is_not_a_wildcard(broker: EmbeddedBroker) -> None:
    c = StompPy(broker.port)
    _subscribe(c, "/queue/a*b")
    c.wait_receipts([c.send("/queue/a*b", "lit")])
    assert c.get().headers["destination"] == "/queue/a*b"
    c.close()
