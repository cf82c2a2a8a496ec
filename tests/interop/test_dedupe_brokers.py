"""Regression tests of issue 14's client bugs, against every broker we test with:
our broker (a real process), ActiveMQ Classic 5.17 and RabbitMQ.

- A copy of a message arriving before the original was acked (a broker that stored a
  replayed SEND twice: ActiveMQ and RabbitMQ do, ours drops it at the source) was
  never acked itself: it came back to the next consumer.
- A caller-supplied subscription ``id`` made every message "for an unknown
  subscription" and ``unsubscribe()`` send the wrong id (an ERROR that hung on
  RabbitMQ).
- Durable subscriptions through one portable API: created, offline, resumed, deleted.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import amqtransport
from amqtransport.testing.broker_process import BrokerProcess

pytestmark = pytest.mark.timeout(180)

BROKERS = ["amq", pytest.param("activemq", marks=pytest.mark.activemq),
           pytest.param("rabbitmq", marks=pytest.mark.rabbitmq)]


@pytest.fixture(scope="module")
def our_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("amq-broker")
    with BrokerProcess(base / "data", log_dir=base / "logs") as proc:
        yield proc


@pytest.fixture(params=BROKERS)
def broker_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The STOMP URI of a running broker of each kind."""
    kind = request.param
    if kind == "amq":
        return str(request.getfixturevalue("our_broker").uri)
    if kind == "activemq":
        return str(request.getfixturevalue("activemq_node").uri)
    return str(request.getfixturevalue("rabbitmq").uri)


def name(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


def test_a_copy_that_arrives_before_the_original_is_acked_is_acked_with_it(broker_uri: str) -> None:
    dest = "/queue/" + name("copy")
    with amqtransport.connect(broker_uri) as conn:
        for _ in range(2):  # a replayed send: the same key twice (stored twice except on ours)
            conn.send(dest, "once", idempotency_key="the-same-key")
        conn.send(dest, "next", idempotency_key="another-key")
        sub = conn.subscribe(dest, ack="client-individual", prefetch=10)
        first = sub.receive(10)
        assert first is not None and first.text == "once"
        second = sub.receive(10)
        assert second is not None and second.text == "next"  # the copy was filtered
        time.sleep(0.5)  # the copy is delivered (and held) by now
        first.ack()
        second.ack()
        time.sleep(0.5)
    with amqtransport.connect(broker_uri, dedupe=False) as conn:
        sub = conn.subscribe(dest, ack="client-individual")
        left = sub.receive(2.0)
        assert left is None, f"the copy stayed unacked and came back: {left.headers if left else None}"


def test_caller_supplied_subscription_id_receives_and_unsubscribes(broker_uri: str) -> None:
    dest = "/queue/" + name("custom-id")
    with amqtransport.connect(broker_uri) as conn:
        sub = conn.subscribe(dest, ack="client-individual", headers={"id": "my-own-id"})
        conn.send(dest, "hello")
        msg = sub.receive(10)
        assert msg is not None and msg.text == "hello", "dropped as a message for an unknown subscription"
        msg.ack()
        assert sub.id == "my-own-id"
        done = threading.Event()
        errors: list[BaseException] = []

        def unsubscribe() -> None:
            try:
                sub.unsubscribe()
            except BaseException as exc:  # reported below
                errors.append(exc)
            done.set()

        threading.Thread(target=unsubscribe, daemon=True).start()
        assert done.wait(15), "unsubscribe() hung"
        assert errors == []
        conn.send(dest, "still usable")


def test_durable_subscription_portable_lifecycle(broker_uri: str) -> None:
    topic = "/topic/" + name("durable")
    sub_name = name("subscription")
    client_id = name("client")
    # failover: ActiveMQ may still hold the previous connection with this client id for a moment
    uri = f"failover:({broker_uri})?initialReconnectDelay=100&maxReconnectDelay=500"
    with amqtransport.connect(uri, client_id=client_id) as conn:
        sub = conn.subscribe(topic, ack="client-individual", durable_name=sub_name)
        conn.send(topic, "while-subscribed")
        msg = sub.receive(10)
        assert msg is not None and msg.text == "while-subscribed"
        msg.ack()
    # closing the connection keeps the subscription: it collects while we are away
    with amqtransport.connect(broker_uri) as producer:
        producer.send(topic, "offline-1")
        producer.send(topic, "offline-2")
    with amqtransport.connect(uri, client_id=client_id) as conn:
        sub = conn.subscribe(topic, ack="client-individual", durable_name=sub_name)
        got = []
        for _ in range(2):
            msg = sub.receive(10)
            assert msg is not None
            got.append(msg.text)
            msg.ack()
        assert got == ["offline-1", "offline-2"]
        sub.unsubscribe(durable=True)
    with amqtransport.connect(broker_uri) as producer:
        producer.send(topic, "after-delete")
    with amqtransport.connect(uri, client_id=client_id) as conn:
        sub = conn.subscribe(topic, ack="client-individual", durable_name=sub_name)
        assert sub.receive(1.5) is None, "the deleted subscription still collected a message"
        sub.unsubscribe(durable=True)
