"""Exclusive consumers, consumer priority and message groups in our broker
(dispatch/consumers.py) beyond the differential test against ActiveMQ
(tests/interop/test_activemq_consumers.py): after a restart, a group closed by
``JMSXGroupSeq:-1`` and one started afresh by ``JMSXGroupSeq:1``, a group message
waiting for its full owner while others go on, a higher-priority exclusive consumer
taking over, and the queue going back to plain round-robin."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import amqtransport
from amqtransport.broker import BrokerConfig, EmbeddedBroker
from amqtransport.broker.dispatch.core import BrokerCore
from amqtransport.broker.dispatch.message import Message
from amqtransport.broker.dispatch.model import Subscription

EXCLUSIVE = {"activemq.exclusive": "true"}


def uri(b: EmbeddedBroker) -> str:
    return f"tcp://127.0.0.1:{b.port}"


def drain(sub: amqtransport.Subscription, quiet: float = 0.4) -> list[str]:
    out = []
    while (m := sub.receive(timeout=quiet)) is not None:
        out.append(m.text)
        m.ack()
    return out


def test_groups_and_exclusivity_after_a_restart(make_broker: Callable[..., EmbeddedBroker], tmp_path: Path) -> None:
    data = tmp_path / "data"
    b = make_broker(data_dir=data)
    with amqtransport.connect(uri(b)) as c:
        for i in range(10):
            c.send("/queue/grp", f"g{i % 2}-{i}", headers={"JMSXGroupID": f"g{i % 2}"})
        for i in range(4):
            c.send("/queue/excl", f"e{i}")
    b.stop()
    b = make_broker(data_dir=data)
    with amqtransport.connect(uri(b)) as c:
        x = c.subscribe("/queue/grp", ack="client-individual", prefetch=1)  # takes g0-0 and owns g0
        y = c.subscribe("/queue/grp", ack="client-individual", prefetch=3)  # then g1; g0's wait for x
        got_x, got_y = drain(x), drain(y)
        assert len(got_x) + len(got_y) == 10
        gx, gy = {t[:2] for t in got_x}, {t[:2] for t in got_y}
        assert gx and gy and not gx & gy  # each group at one consumer, both used
        only = c.subscribe("/queue/excl", ack="client-individual", prefetch=1, headers=EXCLUSIVE)
        plain = c.subscribe("/queue/excl", ack="client-individual")  # gets nothing, even while only is full
        c.send("/queue/excl", "e4")
        assert drain(only) == [f"e{i}" for i in range(5)]
        assert drain(plain, 0.2) == []


def test_group_seq_minus_one_closes_the_group(broker: EmbeddedBroker) -> None:
    with amqtransport.connect(uri(broker)) as c:
        a = c.subscribe("/queue/closing", ack="client-individual", prefetch=100)
        c.send("/queue/closing", "first", headers={"JMSXGroupID": "g"})
        q = broker.server.core.queues["/queue/closing"]
        assert drain(a) == ["first"]
        assert q.groups["g"].id == a.id
        c.send("/queue/closing", "last", headers={"JMSXGroupID": "g", "JMSXGroupSeq": "-1"})
        assert drain(a) == ["last"]
        assert "g" not in q.groups  # closed: its next message picks an owner again
        b = c.subscribe("/queue/closing", ack="client-individual", prefetch=100)
        c.send("/queue/closing", "reopened", headers={"JMSXGroupID": "g"})
        got_a, got_b = drain(a), drain(b)
        assert got_a + got_b == ["reopened"]
        assert q.groups["g"].id == (a.id if got_a else b.id)


def test_group_seq_1_starts_the_group_afresh(broker: EmbeddedBroker) -> None:
    with amqtransport.connect(uri(broker)) as c:
        a = c.subscribe("/queue/restart-group", ack="client-individual", prefetch=1)
        c.send("/queue/restart-group", "a-1", headers={"JMSXGroupID": "g"})
        m = a.receive(timeout=5)
        assert m is not None and m.text == "a-1"  # a owns g and is full
        b = c.subscribe("/queue/restart-group", ack="client-individual", prefetch=10)
        c.send("/queue/restart-group", "fresh", headers={"JMSXGroupID": "g", "JMSXGroupSeq": "1"})
        c.send("/queue/restart-group", "after", headers={"JMSXGroupID": "g"})
        assert drain(b) == ["fresh", "after"]  # seq 1 may go to b, which owns g from then on
        m.ack()
        assert drain(a, 0.2) == []


def test_a_higher_priority_exclusive_consumer_takes_over(broker: EmbeddedBroker) -> None:
    with amqtransport.connect(uri(broker)) as c:
        first = c.subscribe("/queue/takeover", ack="client-individual", headers=EXCLUSIVE)
        c.send("/queue/takeover", "one")
        assert drain(first) == ["one"]
        boss = c.subscribe("/queue/takeover", ack="client-individual",
                           headers={**EXCLUSIVE, "activemq.priority": "5"})
        for body in ("two", "three", "four"):
            c.send("/queue/takeover", body)
        assert drain(boss) == ["two", "three", "four"] and drain(first, 0.2) == []
        boss.unsubscribe()
        c.send("/queue/takeover", "five")
        c.send("/queue/takeover", "six")
        assert drain(first) == ["five", "six"]
        first.unsubscribe()
        rr1 = c.subscribe("/queue/takeover", ack="client-individual")  # plain consumers share again
        rr2 = c.subscribe("/queue/takeover", ack="client-individual")
        for i in range(4):
            c.send("/queue/takeover", f"r{i}")
        assert sorted(drain(rr1) + drain(rr2)) == ["r0", "r1", "r2", "r3"]


def test_a_group_message_waits_for_its_full_owner_others_go_on(broker: EmbeddedBroker) -> None:
    with amqtransport.connect(uri(broker)) as c:
        owner = c.subscribe("/queue/held", ack="client-individual", prefetch=1)
        other = c.subscribe("/queue/held", ack="client-individual", prefetch=10)
        c.send("/queue/held", "g-1", headers={"JMSXGroupID": "g"})  # owner takes it: owns g, now full
        m = owner.receive(timeout=5)
        assert m is not None and m.text == "g-1"
        c.send("/queue/held", "g-2", headers={"JMSXGroupID": "g"})  # waits for the owner
        c.send("/queue/held", "free", headers={"JMSXGroupID": "h"})  # goes on to the other one
        assert drain(other) == ["free"]
        m.ack()
        assert drain(owner) == ["g-2"]


class _Sink:
    """A connection as the core sees it (``writable`` False: its socket is backed up)."""

    def __init__(self, writable: bool = True) -> None:
        self.writable = writable
        self.got: list[bytes] = []

    def deliver(self, sub: Subscription, message: Message, delivery_count: int) -> None:
        self.got.append(message.body)


def test_messages_held_for_a_stuck_exclusive_owner_go_on_when_it_leaves() -> None:
    """An auto-ack exclusive owner whose connection cannot take more holds the queue;
    when it leaves (nothing unacked to return, so no redelivery to wake the queue) the
    next consumer gets the waiting messages at once."""
    core = BrokerCore(BrokerConfig(), None, clock=lambda: 1000.0, monotonic=lambda: 1000.0)
    stuck, other = _Sink(writable=False), _Sink()
    owner = core.subscribe(stuck, "o", "/queue/stuck", exclusive=True)
    core.subscribe(other, "p", "/queue/stuck")
    for i in range(3):
        core.send("/queue/stuck", (), f"m{i}".encode(), persistent=False)
    assert stuck.got == [] and other.got == []
    core.unsubscribe(owner)
    assert other.got == [b"m0", b"m1", b"m2"]
