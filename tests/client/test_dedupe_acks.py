"""The duplicate filter's acks (scripted endpoints: the exact ACK frames matter).

A dropped copy is acked once its original is, never before, and in ``client``
(cumulative) mode never by an ACK that would cover a message the application has not
acknowledged. The same bugs against real brokers: tests/interop/test_dedupe_brokers.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import amqtransport
from amqtransport._backends.memory import MemoryBackend, ScriptedBroker
from amqtransport.errors import LocalProtocolError
from amqtransport.stomp import IDEMPOTENCY_HEADER
from amqtransport.testing.wait import wait_for

pytestmark = pytest.mark.timeout(30)



def acked_ids(broker: ScriptedBroker, command: str = "ACK") -> list[str]:
    return [f.get("id") or "" for f in broker.frames(command)]


def deliver(broker: ScriptedBroker, key: str, dest: str = "/queue/d") -> str:
    return broker.deliver(dest, key, {IDEMPOTENCY_HEADER: key}).get("ack") or ""


@pytest.fixture
def broker() -> tuple[MemoryBackend, ScriptedBroker]:
    backend = MemoryBackend()
    return backend, backend.add("a:1")


def test_copy_arriving_before_the_original_is_acked_is_acked_after_it(broker: Any) -> None:
    """On one link (a broker that stored a replayed SEND twice): the copy used to stay
    unacked forever and come back on the next link."""
    backend, a = broker
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:
        sub = conn.subscribe("/queue/d", ack="client-individual")
        original, copy = deliver(a, "k1"), deliver(a, "k1")
        msg = sub.receive(2)
        assert msg is not None and sub.receive(0.1) is None
        assert conn.duplicates == 1
        time.sleep(0.05)
        assert acked_ids(a) == []  # not before the application acked the original
        msg.ack()
        wait_for(lambda: acked_ids(a) == [original, copy])


def test_client_mode_copy_is_not_acked_past_an_unacked_message(broker: Any) -> None:
    """ack='client': an ACK is cumulative. A copy of an acked message arriving after a
    message the application still holds must not be acked yet (that ACK would also
    acknowledge the held one: lost if the application then fails)."""
    backend, a = broker
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:
        sub = conn.subscribe("/queue/d", ack="client")
        x1 = deliver(a, "x1")
        m_x1 = sub.receive(2)
        assert m_x1 is not None
        m_x1.ack()
        wait_for(lambda: acked_ids(a) == [x1])
        y1 = deliver(a, "y1")
        m_y1 = sub.receive(2)
        assert m_y1 is not None
        x1_copy = deliver(a, "x1")
        time.sleep(0.1)
        assert acked_ids(a) == [x1], "the copy's cumulative ACK would have covered y1"
        assert sub.receive(0.05) is None
        m_y1.ack()  # now nothing unacked precedes the copy: it gets its own ACK
        wait_for(lambda: acked_ids(a) == [x1, y1, x1_copy])


def test_client_mode_copy_at_the_head_is_acked_on_arrival(broker: Any) -> None:
    backend, a = broker
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:
        sub = conn.subscribe("/queue/d", ack="client")
        first = deliver(a, "k1")
        msg = sub.receive(2)
        assert msg is not None
        msg.ack()
        copy = deliver(a, "k1")
        wait_for(lambda: acked_ids(a) == [first, copy])


def test_client_mode_cumulative_ack_counts_for_the_earlier_originals(broker: Any) -> None:
    """The application acks only the last of three (cumulative): copies of the first
    two are owed an ACK too, once nothing unacked precedes them."""
    backend, a = broker
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:
        sub = conn.subscribe("/queue/d", ack="client")
        ids = [deliver(a, k) for k in ("k1", "k2", "k3")]
        msgs = [sub.receive(2) for _ in range(3)]
        assert all(m is not None for m in msgs)
        c1 = deliver(a, "k1")  # a copy of k1 while k1..k3 are not acked yet
        time.sleep(0.05)
        assert acked_ids(a) == []
        msgs[2].ack()  # type: ignore[union-attr]
        # covers k1..k3; the copy came after k3, so it needs its own ACK
        wait_for(lambda: acked_ids(a) == [ids[2], c1])
        msgs[0].ack()  # type: ignore[union-attr]  # already covered: no second (unexpected) ACK
        c2 = deliver(a, "k2")
        wait_for(lambda: acked_ids(a) == [ids[2], c1, c2])


def test_client_mode_copy_before_the_originals_ack_waits_for_it(broker: Any) -> None:
    backend, a = broker
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:
        sub = conn.subscribe("/queue/d", ack="client")
        first = deliver(a, "k1")
        m1 = sub.receive(2)
        assert m1 is not None
        copy = deliver(a, "k1")  # a copy before the original's ack: it waits
        later = deliver(a, "k2")
        m2 = sub.receive(2)
        assert m2 is not None
        time.sleep(0.05)
        assert acked_ids(a) == []
        m1.ack()  # the copy is now at the head of what is unsettled: its ACK covers nothing more
        wait_for(lambda: acked_ids(a) == [first, copy])
        m2.ack()
        wait_for(lambda: acked_ids(a) == [first, copy, later])


@pytest.mark.parametrize(("dialect", "nacks"), [("rabbitmq", 1), ("amq", 1), ("activemq", 2)])
def test_client_mode_nack_is_cumulative_and_consistent(broker: Any, dialect: str, nacks: int) -> None:
    """A NACK in client mode rejects every earlier unacked message too (RabbitMQ, our
    broker): their redeliveries must reach the application, and acking one of the
    rejected messages afterwards is refused instead of killing the connection. Where
    the broker rejects only the message named (ActiveMQ), each one is NACKed."""
    backend, a = broker
    with amqtransport.connect(f"tcp://a:1?dialect={dialect}", backend=backend) as conn:
        sub = conn.subscribe("/queue/d", ack="client")
        ids = [deliver(a, k) for k in ("k1", "k2", "k3")]
        m1, m2, m3 = (sub.receive(2) for _ in range(3))
        assert m1 is not None and m2 is not None and m3 is not None
        m2.nack()
        assert acked_ids(a, "NACK") == ids[2 - nacks:2]
        for k in ("k1", "k2"):  # the broker requeued both
            a.deliver("/queue/d", k, {IDEMPOTENCY_HEADER: k, "redelivered": "true"})
        again = [sub.receive(2), sub.receive(2)]
        assert [m.text for m in again if m is not None] == ["k1", "k2"]
        with pytest.raises(LocalProtocolError, match="cumulative"):
            m1.ack()
        m3.ack()
        assert len(a.frames("ACK")) == 1


def test_client_individual_nack_forgets_only_that_message(broker: Any) -> None:
    backend, a = broker
    with amqtransport.connect("tcp://a:1", backend=backend) as conn:
        sub = conn.subscribe("/queue/d", ack="client-individual")
        deliver(a, "k1")
        deliver(a, "k2")
        m1, m2 = sub.receive(2), sub.receive(2)
        assert m1 is not None and m2 is not None
        m2.nack()
        a.deliver("/queue/d", "k2", {IDEMPOTENCY_HEADER: "k2", "redelivered": "true"})
        a.deliver("/queue/d", "k1", {IDEMPOTENCY_HEADER: "k1", "redelivered": "true"})
        again = sub.receive(2)
        assert again is not None and again.text == "k2"
        assert sub.receive(0.1) is None  # k1 was not rejected: its copy is a duplicate
        m1.ack()


def test_bridge_client_mode_never_acks_what_is_not_forwarded_yet() -> None:
    """The bridge in ack_mode='client': a filtered duplicate arriving while a batch
    waits for the far broker's receipts must not be acked on arrival (its cumulative
    ACK covered the batch, which a failure then lost)."""
    from bridge.forwarder import DestinationForwarder, NodeId
    from bridge.status import StatusRegistry

    backend = MemoryBackend()
    src_broker, dst_broker = backend.add("src:1"), backend.add("dst:2")
    failures: list[BaseException] = []
    with amqtransport.connect("tcp://src:1", backend=backend) as src, \
            amqtransport.connect("tcp://dst:2", backend=backend) as dst:
        fwd = DestinationForwarder(src=src, dst=dst, destination="/queue/b", here=NodeId("src"),
                                   there=NodeId("dst"), ttl=3, prefetch=1,
                                   status=StatusRegistry().register("b", connector="src", service="dst"),
                                   on_failure=failures.append, poll=0.05, ack_mode="client")
        fwd.start()
        try:
            assert fwd.subscribed.wait(5)
            x1 = src_broker.deliver("/queue/b", "x1", {IDEMPOTENCY_HEADER: "x1"}).get("ack")
            wait_for(lambda: acked_ids(src_broker) == [x1])  # forwarded, receipted, acked
            dst_broker.hold_receipts = True  # the far broker is slow from now on
            src_broker.deliver("/queue/b", "y1", {IDEMPOTENCY_HEADER: "y1"})
            wait_for(lambda: [f.get(IDEMPOTENCY_HEADER) for f in dst_broker.frames("SEND")] == ["x1", "y1"])
            src_broker.deliver("/queue/b", "x1", {IDEMPOTENCY_HEADER: "x1", "redelivered": "true"})
            time.sleep(0.3)
            assert acked_ids(src_broker) == [x1], "y1 was acked on the source before the far broker had it"
        finally:
            fwd.stop()
            dst_broker.hold_receipts = False
            for stream in dst_broker.live:  # release the held receipts so the forwarder can stop
                for f in stream.frames:
                    if f.command == "SEND" and f.get("receipt"):
                        from amqtransport.stomp import Frame

                        stream.push_frame(Frame.make("RECEIPT", {"receipt-id": f.get("receipt") or ""}))
            fwd.join(5)
    assert failures == []


def test_copies_of_a_dead_link_are_handled_on_the_new_one() -> None:
    """The failover case (already right before): an ACK that cannot go out on the dead
    link counts as acked; the redelivered copy on the new link is acked on arrival."""
    backend = MemoryBackend()
    a, b = backend.add("a:1"), backend.add("b:2")
    resumed = threading.Event()

    class L:
        def on_resumed(self, address: str) -> None:
            resumed.set()

    with amqtransport.connect("failover:(tcp://a:1,tcp://b:2)?randomize=false", backend=backend,
                              sleep=lambda s: None, listener=L()) as conn:
        sub = conn.subscribe("/queue/d", ack="client")
        deliver(a, "k1")
        m1 = sub.receive(2)
        assert m1 is not None
        a.up = False
        a.drop()
        assert resumed.wait(5)
        m1.ack()  # its link is gone
        copy = deliver(b, "k1")
        wait_for(lambda: acked_ids(b) == [copy])
        assert sub.receive(0.05) is None
