"""The bridge between our broker and a real RabbitMQ (static includes, advisories off),
both ways, through a ``kill -9`` of RabbitMQ.

RabbitMQ keeps the bridge's hop headers as plain headers and does not deduplicate: a
batch forwarded again after the kill can be stored twice there, and the consumer's
duplicate filter (keyed on the idempotency key the bridge forwards) hides the copy.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from bridge_helpers import wait_for

import amqtransport
from amqtransport.broker import EmbeddedBroker
from amqtransport.testing.rabbitmq import RabbitMQNode
from bridge.agent import BridgeAgent
from bridge.config import parse_config

pytestmark = [pytest.mark.rabbitmq, pytest.mark.timeout(240)]


@pytest.fixture
def ours() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=0, name="ours") as b:
        yield b


def drain(uri: str, dest: str, expect: int, timeout: float = 30.0) -> tuple[list[str], int]:
    """What the application sees (duplicate filter on) and how many copies it dropped."""
    got: list[str] = []
    with amqtransport.connect(uri) as c:
        sub = c.subscribe(dest, ack="client-individual", prefetch=500)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(got) < expect:
            m = sub.receive(timeout=0.2)
            if m is not None:
                got.append(m.text)
                m.ack()
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            m = sub.receive(timeout=0.1)
            if m is not None:
                got.append(m.text)
                m.ack()
        return got, c.duplicates


def test_bridge_between_our_broker_and_rabbitmq(ours: EmbeddedBroker, rabbitmq: RabbitMQNode) -> None:
    tag = uuid.uuid4().hex[:8]
    out_q, back_q = f"/queue/orders.{tag}", f"/queue/replies.{tag}"
    to_rabbit = parse_config(f'''
local_uri = "{ours.uri}"
status_listen = ""
[[network_connector]]
name = "ours-to-rabbit"
uri = "static:(tcp://127.0.0.1:{rabbitmq.stomp_port})?initialReconnectDelay=200&maxReconnectDelay=1000"
static_include = ["{out_q}"]
advisories = "off"
heartbeat_ms = 1000
''')
    from_rabbit = parse_config(f'''
local_uri = "failover:(tcp://127.0.0.1:{rabbitmq.stomp_port})?initialReconnectDelay=200&maxReconnectDelay=1000"
status_listen = ""
[[network_connector]]
name = "rabbit-to-ours"
uri = "static:({ours.uri})?initialReconnectDelay=200&maxReconnectDelay=1000"
static_include = ["{back_q}"]
advisories = "off"
heartbeat_ms = 1000
''')
    with BridgeAgent(to_rabbit) as out_agent, BridgeAgent(from_rabbit) as back_agent:
        def st() -> dict[str, object]:
            return out_agent.registry.snapshot()["bridges"][0]

        def back() -> dict[str, object]:
            return back_agent.registry.snapshot()["bridges"][0]

        wait_for(lambda: st()["state"] == "up" and back()["state"] == "up", 60, "both bridges up")
        with amqtransport.connect(ours.uri) as c, c.producer(window=50) as p:
            for i in range(200):
                p.send(out_q, f"a{i}")
        with amqtransport.connect(rabbitmq.uri) as c, c.producer(window=50) as p:
            for i in range(50):
                p.send(back_q, f"r{i}")
        wait_for(lambda: st()["forwarded"] >= 200, 60, "ours -> RabbitMQ")  # type: ignore[operator]
        wait_for(lambda: back()["forwarded"] >= 50, 60, "RabbitMQ -> ours")  # type: ignore[operator]
        rabbitmq.persist_definitions()  # the queue the bridge declared survives the crash below

        # kill -9 RabbitMQ while more is sent on our side; the bridge is rebuilt after its restart
        restarter = threading.Thread(target=lambda: (rabbitmq.kill(), rabbitmq.start()))
        with amqtransport.connect(ours.uri) as c, c.producer(window=20) as p:
            for i in range(200):
                p.send(out_q, f"b{i}")
                if i == 50:
                    restarter.start()
        restarter.join(120)
        wait_for(lambda: st()["state"] == "up" and st()["rebuilds"] >= 1, 90, "bridge rebuilt on the restarted node")  # type: ignore[operator]
        wait_for(lambda: st()["forwarded"] >= 400, 90, "the rest forwarded")  # type: ignore[operator]

    got, dropped = drain(rabbitmq.uri, out_q, expect=400)
    want = [f"a{i}" for i in range(200)] + [f"b{i}" for i in range(200)]
    assert Counter(got) == Counter(want), (sorted(set(want) - set(got))[:10], len(got))
    back, _ = drain(ours.uri, back_q, expect=50)  # forwarded before the kill
    assert Counter(back) == Counter(f"r{i}" for i in range(50))
    print(f"bridge ours <-> RabbitMQ through kill -9: 400 forwarded, {dropped} RabbitMQ copies dropped by the filter")
