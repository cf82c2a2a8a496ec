"""DISCONNECT detaches the connection's subscriptions at once.

Before, they stayed attached until the socket was gone, so a message published in
between (after the client had its DISCONNECT receipt) could be handed to the closing
connection -- and, for an auto-ack durable subscription, acked and lost. ActiveMQ removes
the consumers when it processes the DISCONNECT; so do we now.
"""

from __future__ import annotations

import uuid

import amqtransport
from amqtransport.broker import EmbeddedBroker


def test_durable_subscriber_misses_nothing_published_right_after_its_disconnect(broker: EmbeddedBroker) -> None:
    uri = f"tcp://127.0.0.1:{broker.port}"
    lost = []
    with amqtransport.connect(uri) as producer:
        for k in range(30):
            topic, client = f"/topic/dd.{uuid.uuid4().hex[:8]}", f"dd-{k}"
            with amqtransport.connect(uri, client_id=client) as c:
                c.subscribe(topic, durable_name="d")
            for i in range(3):
                producer.send(topic, f"m{i}")
            with amqtransport.connect(uri, client_id=client) as c:
                sub = c.subscribe(topic, durable_name="d")
                got: list[str] = []
                while len(got) < 3 and (m := sub.receive(timeout=5)) is not None:
                    got.append(m.text)
                while (m := sub.receive(timeout=0.05)) is not None:
                    got.append(m.text)
                sub.unsubscribe(durable=True)
            if got != ["m0", "m1", "m2"]:
                lost.append((k, got))
    assert lost == []
