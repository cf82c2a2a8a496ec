"""A wildcard static queue include between two of our brokers (they support wildcard queue consumers)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import bridge_helpers
import pytest
from bridge_helpers import connector_toml

import amqtransport
from amqtransport.broker import EmbeddedBroker
from bridge.agent import BridgeAgent
from bridge.config import parse_config

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def agents() -> Iterator[list[BridgeAgent]]:
    started: list[BridgeAgent] = []
    yield started
    for a in started:
        a.stop()


def send(uri: str, dest: str, bodies: list[str]) -> None:
    with amqtransport.connect(uri) as c, c.producer(window=100) as p:
        for b in bodies:
            p.send(dest, b)


def drain(uri: str, dest: str, *, expect: int, timeout: float = 20.0, grace: float = 0.5) -> list[tuple[str, str]]:
    """(destination, body) of what ``dest`` (a wildcard is fine) delivers."""
    got: list[tuple[str, str]] = []
    with amqtransport.connect(uri) as c:
        sub = c.subscribe(dest, ack="auto")
        deadline = time.monotonic() + timeout
        while len(got) < expect and time.monotonic() < deadline:
            m = sub.receive(timeout=0.2)
            if m is not None:
                got.append((m.headers["destination"], m.text))
        end = time.monotonic() + grace  # duplicates, if any, show up now
        while time.monotonic() < end:
            m = sub.receive(timeout=0.1)
            if m is not None:
                got.append((m.headers["destination"], m.text))
    return got


def test_wildcard_static_queue_include_forwards_every_matching_queue(agents: list[BridgeAgent]) -> None:
    with EmbeddedBroker(port=0, name="spoke") as spoke, EmbeddedBroker(port=0, name="hub") as hub:
        send(spoke.uri, "/queue/orders.a", ["a0", "a1"])  # a queue that exists before the bridge
        text = connector_toml(spoke.uri, f"static:({hub.uri})?initialReconnectDelay=100", "spoke-to-hub",
                              {"static_include": ["/queue/orders.>"], "heartbeat_ms": 1000})
        agent = BridgeAgent(parse_config(text))
        agents.append(agent.start())
        snap = lambda: agent.registry.snapshot()["bridges"][0]  # noqa: E731
        bridge_helpers.wait_for(lambda: snap()["state"] == "up", 20, "bridge up")
        send(spoke.uri, "/queue/orders.b", ["b0", "b1", "b2"])  # created after the bridge subscribed
        send(spoke.uri, "/queue/orders.eu.c", ["c0"])
        send(spoke.uri, "/queue/invoices.a", ["not forwarded"])
        bridge_helpers.wait_for(lambda: int(snap()["forwarded"]) == 6, 20, "six messages forwarded")
        got = drain(hub.uri, "/queue/orders.>", expect=6)
        assert Counter(got) == Counter([
            ("/queue/orders.a", "a0"), ("/queue/orders.a", "a1"),
            ("/queue/orders.b", "b0"), ("/queue/orders.b", "b1"), ("/queue/orders.b", "b2"),
            ("/queue/orders.eu.c", "c0"),
        ])
        queues = spoke.stats()["queues"]
        assert queues["/queue/invoices.a"]["depth"] == 1  # type: ignore[index]
        assert all(q["depth"] == 0 for k, q in queues.items() if k.startswith("/queue/orders."))  # type: ignore[index,union-attr]
        assert drain(hub.uri, "/queue/invoices.a", expect=1, timeout=0.5, grace=0.1) == []
