"""Interop: our bridge into a real ActiveMQ 5.17 shared-store master/slave pair.

The seed's configuration, with ActiveMQ on the far side: ``masterslave:(master,slave)``.
SIGKILL of the ActiveMQ master: the failover under the bridge gives up after one pass,
the connector backs off and retries until the slave has taken the lock and serves,
then builds a new bridge there; status shows the slave's address. ActiveMQ does not
drop duplicates by our idempotency header, so a kill *under traffic* could duplicate;
this test kills between batches and asserts exactly-once. Against ActiveMQ the
dynamic include is forwarded statically (no advisories over STOMP on 5.17; the
CONNECTED ``server`` header says ActiveMQ).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

import amqtransport
from amqtransport.broker import EmbeddedBroker
from amqtransport.testing.wait import wait_for as _wait_for
from bridge.agent import BridgeAgent
from bridge.config import parse_config

pytestmark = [pytest.mark.activemq, pytest.mark.timeout(240)]


def wait_for(cond: Callable[[], object], timeout: float, what: str) -> None:
    _wait_for(cond, timeout, what, interval=0.05)


@pytest.fixture
def spoke() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=0, name="spoke") as b:
        yield b


def drain(uri: str, dest: str, expect: int, timeout: float = 30.0) -> list[str]:
    got: list[str] = []
    with amqtransport.connect(uri) as c:
        sub = c.subscribe(dest, ack="client-individual")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(got) < expect:
            m = sub.receive(timeout=0.2)
            if m is not None:
                got.append(m.text)
                m.ack()
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            m = sub.receive(timeout=0.1)
            if m is not None:
                got.append(m.text)
                m.ack()
    return got


def test_bridge_into_activemq_pair_rebuilt_after_master_kill(spoke: EmbeddedBroker, activemq_pair: object) -> None:
    pair = activemq_pair
    master, slave = pair.master.uri, pair.slave.uri  # type: ignore[attr-defined]
    cfg = parse_config(f'''
local_uri = "{spoke.uri}"
status_listen = "127.0.0.1:0"
[[network_connector]]
name = "spoke-to-amq"
uri = "masterslave:({master},{slave})?initialReconnectDelay=200&maxReconnectDelay=1000"
static_include = ["/queue/orders"]
dynamic_include = ["/queue/events.eu"]
heartbeat_ms = 1000
''')
    with BridgeAgent(cfg) as agent:
        def st() -> dict[str, object]:
            return agent.registry.snapshot()["bridges"][0]

        wait_for(lambda: st()["state"] == "up", 30, "bridge up on the ActiveMQ master")
        assert st()["remote"] == master
        # no advisories from ActiveMQ over STOMP: the dynamic include is forwarded statically
        wait_for(lambda: "local->remote /queue/events.eu" in st()["destinations"], 10, "static fallback")  # type: ignore[operator]
        with amqtransport.connect(spoke.uri) as c, c.producer(window=50) as p:
            for i in range(100):
                p.send("/queue/orders", f"a{i}")
            p.send("/queue/events.eu", "ev")
        wait_for(lambda: st()["forwarded"] == 101, 30, "first batch forwarded")

        pair.kill_master()  # type: ignore[attr-defined]
        t0 = time.monotonic()
        wait_for(lambda: st()["state"] == "up" and st()["remote"] == slave, 60, "bridge rebuilt on the slave")
        print(f"bridge up on the ActiveMQ slave {time.monotonic() - t0:.2f}s after SIGKILL of the master")
        assert st()["rebuilds"] == 1

        with amqtransport.connect(spoke.uri) as c, c.producer(window=50) as p:
            for i in range(100):
                p.send("/queue/orders", f"b{i}")
        wait_for(lambda: st()["forwarded"] == 201, 30, "second batch forwarded")
    got = drain(slave, "/queue/orders", expect=200)
    assert Counter(got) == Counter([f"a{i}" for i in range(100)] + [f"b{i}" for i in range(100)])
    assert drain(slave, "/queue/events.eu", expect=1, timeout=5) == ["ev"]
