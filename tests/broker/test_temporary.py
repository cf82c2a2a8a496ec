"""Temporary destinations in our broker beyond the differential tests
(tests/interop/test_activemq_temporary.py): nothing of them outlives their connection,
no wildcard subscriber reads them, and they are never written to the journal
(amqtransport/broker/dispatch/temporary.py)."""

from __future__ import annotations

import time

import pytest

import amqtransport
from amqtransport.broker import EmbeddedBroker
from amqtransport.errors import BrokerError

pytestmark = pytest.mark.timeout(60)


def uri(b: EmbeddedBroker) -> str:
    return f"tcp://127.0.0.1:{b.port}"


def temp_keys(b: EmbeddedBroker) -> list[str]:
    core = b.server.core
    assert core is not None
    return [k for k in [*core.queues, *core.topics] if k.startswith("/temp-")]


def wait_until(predicate: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_everything_of_a_connection_goes_with_it(broker: EmbeddedBroker) -> None:
    owner = amqtransport.connect(uri(broker))
    owner.subscribe("/temp-queue/a")
    owner.subscribe("/temp-topic/b")
    owner.send("/temp-queue/held", "never read", persistent=True)  # a queue with a message, no consumer
    assert len(temp_keys(broker)) == 3
    core = broker.server.core
    assert core is not None and len(core.temporaries) == 3
    owner.close()
    assert wait_until(lambda: temp_keys(broker) == [] and len(core.temporaries) == 0)


def test_no_wildcard_subscriber_reads_a_temporary_destination(broker: EmbeddedBroker) -> None:
    with amqtransport.connect(uri(broker)) as owner, amqtransport.connect(uri(broker)) as snoop:
        topics = snoop.subscribe("/topic/>")
        queues = snoop.subscribe("/queue/>")
        own_topic = owner.subscribe("/temp-topic/t")
        own_queue = owner.subscribe("/temp-queue/q")
        owner.send("/temp-topic/t", "to the temp topic")
        owner.send("/temp-queue/q", "to the temp queue")
        got = [own_topic.receive(timeout=10), own_queue.receive(timeout=10)]
        assert [m.text for m in got if m is not None] == ["to the temp topic", "to the temp queue"]
        owner.send("/topic/plain", "seen by the wildcard")  # the wildcard works: it is only blind to these
        seen = topics.receive(timeout=10)
        assert seen is not None and seen.text == "seen by the wildcard"
        assert topics.receive(timeout=0.3) is None and queues.receive(timeout=0.3) is None


def test_a_persistent_message_to_a_temp_queue_is_not_journaled(broker: EmbeddedBroker) -> None:
    store = broker.server.store
    assert store is not None
    with amqtransport.connect(uri(broker)) as owner:
        before = store.stats()
        owner.send("/temp-queue/mem", b"x" * 1000, persistent=True)
        sub = owner.subscribe("/temp-queue/mem")
        msg = sub.receive(timeout=10)
        assert msg is not None and msg.body == b"x" * 1000
        owner.send("/queue/control", b"y", persistent=True)  # a journaled one, for comparison
        after = store.stats()
    assert after.records == before.records + 1, (before, after)  # the control message's alone


def test_a_durable_subscription_to_a_temp_topic_is_refused(broker: EmbeddedBroker) -> None:
    with amqtransport.connect(uri(broker), client_id="tmp-durable") as conn:
        with pytest.raises(BrokerError, match="durable subscription cannot be made to a temporary topic"):
            conn.subscribe("/temp-topic/t", durable_name="d")
