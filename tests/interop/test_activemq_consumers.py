"""Which consumer gets a queue message, differential: exclusive consumers
(``activemq.exclusive``), consumer priority (``activemq.priority``) and message groups
(``JMSXGroupID``), the same scenarios against our broker and ActiveMQ 5.17 (one JVM
for this module), asserting one outcome. Our rules are amqtransport/broker/dispatch/consumers.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from differential import BROKERS, broker

import amqtransport
from amqtransport.errors import BrokerError

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module", params=BROKERS)
def broker_uri(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``tcp://`` of our broker or of ActiveMQ 5.17 (one JVM for the whole module)."""
    with broker(request.param, tmp_path_factory, "consumers") as uri:
        yield uri


def unique() -> str:
    return f"/queue/cons.{uuid.uuid4().hex[:10]}"


def drain(sub: amqtransport.Subscription, quiet: float = 0.5, *, ack: bool = True) -> list[amqtransport.Message]:
    """What ``sub`` has been sent, until ``quiet`` seconds pass without a message."""
    out = []
    while (m := sub.receive(timeout=quiet)) is not None:
        out.append(m)
        if ack:
            m.ack()
    return out


def texts(msgs: list[amqtransport.Message]) -> list[str]:
    return [m.text for m in msgs]


EXCLUSIVE = {"activemq.exclusive": "true"}


def test_exclusive_consumer_gets_everything_then_the_next_one(broker_uri: str) -> None:
    q = unique()
    with amqtransport.connect(broker_uri) as c:
        first = c.subscribe(q, ack="client-individual", headers=EXCLUSIVE)
        second = c.subscribe(q, ack="client-individual", headers=EXCLUSIVE)
        for i in range(6):
            c.send(q, f"m{i}")
        got_first = drain(first, ack=False)
        assert texts(got_first) == [f"m{i}" for i in range(6)]
        assert drain(second, 0.3) == []
        for m in got_first[:4]:
            m.ack()
        first.unsubscribe()  # m4, m5 not acked: they go to the next exclusive consumer
        c.send(q, "m6")
        assert texts(drain(second)) == ["m4", "m5", "m6"]


def test_exclusive_consumer_starves_the_others(broker_uri: str) -> None:
    q = unique()
    with amqtransport.connect(broker_uri) as c:
        plain = c.subscribe(q, ack="client-individual")
        exclusive = c.subscribe(q, ack="client-individual", headers=EXCLUSIVE)
        for i in range(5):
            c.send(q, f"m{i}")
        assert texts(drain(exclusive)) == [f"m{i}" for i in range(5)]
        assert drain(plain, 0.3) == []


def test_higher_priority_consumer_first_while_it_has_room(broker_uri: str) -> None:
    q = unique()
    with amqtransport.connect(broker_uri) as c:
        low = c.subscribe(q, ack="client-individual", prefetch=100)
        high = c.subscribe(q, ack="client-individual", prefetch=2, headers={"activemq.priority": "10"})
        for i in range(6):
            c.send(q, f"m{i}")
        got_high = drain(high, ack=False)
        assert texts(got_high) == ["m0", "m1"]  # then it is full: the rest go to the low one
        assert texts(drain(low)) == ["m2", "m3", "m4", "m5"]
        for m in got_high:
            m.ack()
        c.send(q, "m6")
        assert texts(drain(high)) == ["m6"]


def test_a_message_group_sticks_to_one_consumer_then_moves(broker_uri: str) -> None:
    q = unique()
    with amqtransport.connect(broker_uri) as c:
        a = c.subscribe(q, ack="client-individual", prefetch=100)
        b = c.subscribe(q, ack="client-individual", prefetch=100)
        for i in range(12):
            c.send(q, f"g{i % 3}-{i}", headers={"JMSXGroupID": f"g{i % 3}"})
        got_a, got_b = drain(a), drain(b)
        groups_a = {m.text.split("-")[0] for m in got_a}
        groups_b = {m.text.split("-")[0] for m in got_b}
        assert not groups_a & groups_b and groups_a | groups_b == {"g0", "g1", "g2"}
        assert len(got_a) + len(got_b) == 12
        for got in (got_a, got_b):  # each group in order at its consumer
            for g in ("g0", "g1", "g2"):
                seq = [int(m.text.split("-")[1]) for m in got if m.text.startswith(g)]
                assert seq == sorted(seq)
        # JMSXGroupFirstForConsumer is not a STOMP header on ActiveMQ 5.17, nor on ours
        assert all("JMSXGroupFirstForConsumer" not in m.headers for m in got_a + got_b)
        a.unsubscribe()  # its groups move to b
        for i in range(3):
            c.send(q, f"late-{i}", headers={"JMSXGroupID": f"g{i}"})
        assert texts(drain(b)) == ["late-0", "late-1", "late-2"]


def test_bad_consumer_priority_differs_on_purpose(broker_uri: str) -> None:
    """Ours: ERROR naming the header, the connection keeps working. ActiveMQ 5.17 accepts
    ``activemq.priority:high`` (or 200) silently and subscribes with its default priority."""
    q = unique()
    with amqtransport.connect(broker_uri) as c:
        if c.server is not None and "ActiveMQ" in c.server:
            sub = c.subscribe(q, headers={"activemq.priority": "high"})
            c.send(q, "taken")
            assert texts(drain(sub)) == ["taken"]
            return
        with pytest.raises(BrokerError, match=r"activemq.priority must be an integer from -128 to 127, got 'high'"):
            c.subscribe(q, headers={"activemq.priority": "high"})
        c.send(q, "still-works")
        assert texts(drain(c.subscribe(q))) == ["still-works"]


def test_group_seq_1_starts_a_group_afresh_and_minus_1_closes_it(broker_uri: str) -> None:
    q = unique()
    with amqtransport.connect(broker_uri) as c:
        a = c.subscribe(q, ack="client-individual", prefetch=1)
        c.send(q, "a-1", headers={"JMSXGroupID": "g"})
        first = a.receive(timeout=10)
        assert first is not None and first.text == "a-1"  # a owns g and is full
        b = c.subscribe(q, ack="client-individual", prefetch=10)
        c.send(q, "fresh", headers={"JMSXGroupID": "g", "JMSXGroupSeq": "1"})
        c.send(q, "after", headers={"JMSXGroupID": "g"})
        assert texts(drain(b)) == ["fresh", "after"]  # seq 1: b took it and owns g now
        first.ack()
        assert drain(a, 0.3) == []
        c.send(q, "last", headers={"JMSXGroupID": "g", "JMSXGroupSeq": "-1"})
        assert texts(drain(b)) == ["last"]  # the owner gets it, and the group is closed
        b.unsubscribe()
        c.send(q, "reopened", headers={"JMSXGroupID": "g"})
        assert texts(drain(a)) == ["reopened"]
