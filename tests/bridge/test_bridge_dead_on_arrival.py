"""The bridge's remote link dies together with its CONNECTED frame (the nemesis's N5).

In a 200-round nemesis run the bridge was rebuilt on a hub master's proxy (200 ms of
latency on it) 85 ms after that master was SIGKILLed: CONNECTED and the end of the
stream reached the bridge together. The remote failover transport kept the dead link
as current (its reader had reported the loss before the link was installed), so the
bridge never heard ``on_failed``, its forwarder waited forever for receipts, and 554
receipted messages stayed on the spoke. Here the same arrival order, first on the
scripted in-memory backend (deterministic), then with real processes: a hub pair, the
chaos proxy holding the master's CONNECTED for a second, the master SIGKILLed in that
second.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bridge_helpers import connector_toml, wait_for

import amqtransport
from amqtransport._backends.memory import MemoryBackend
from bridge.agent import BridgeAgent
from bridge.config import parse_config

pytestmark = pytest.mark.timeout(180)



def status(agent: BridgeAgent) -> dict[str, Any]:
    return agent.registry.snapshot()["bridges"][0]


def test_scripted_remote_dead_on_arrival_bridge_is_rebuilt_and_forwards() -> None:
    backend = MemoryBackend()
    spoke, hub_a, _hub_b = backend.add("s:1"), backend.add("a:1"), backend.add("b:2")
    hub_a.dead_on_arrival = 1
    text = connector_toml("tcp://s:1", "masterslave:(tcp://a:1,tcp://b:2)?initialReconnectDelay=10", "nc",
                          {"static_include": ["/queue/orders"], "probe_interval_ms": 0, "heartbeat_ms": 0})

    def connect(uri: str, **kwargs: Any) -> Any:
        return amqtransport.connect(uri, backend=backend, **kwargs)

    agent = BridgeAgent(parse_config(text), connect=connect).start()
    try:
        # the first bridge's remote link was dead on arrival: it must fail and be rebuilt
        wait_for(lambda: status(agent)["state"] == "up" and int(status(agent)["rebuilds"]) >= 1, 10,
                 "a rebuilt bridge")
        wait_for(lambda: any(f.get("destination") == "/queue/orders" for f in spoke.frames("SUBSCRIBE")), 10,
                 "the forwarder's subscription on the spoke")
        spoke.deliver("/queue/orders", "hello", {"amq-idempotency-key": "k1"})
        wait_for(lambda: [f.body for f in hub_a.frames("SEND")] == [b"hello"], 10, "the message on the hub")
        wait_for(lambda: len(spoke.frames("ACK")) == 1, 10, "its ACK on the spoke")
    finally:
        agent.stop()


# ------------------------------------------------------------------ real processes


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Any]:
    from amqtransport.testing.broker_pair import BrokerPair

    with BrokerPair("replicated", data_dir=tmp_path / "hub") as pair:
        yield pair


def test_hub_master_killed_while_its_connected_is_in_flight_bridge_recovers(hub: Any, tmp_path: Path) -> None:
    from toxiproxy import Toxiproxy

    from amqtransport.testing.broker_process import BrokerProcess
    from amqtransport.testing.ports import free_port
    from chaos.proxy.server import ToxiproxyServer

    latency_ms = 1000
    master = hub.wait_master()
    with ToxiproxyServer(port=0) as server, \
            BrokerProcess(tmp_path / "spoke", port=free_port(), log_dir=tmp_path / "logs") as spoke:
        toxi = Toxiproxy()
        toxi.update_api_consumer("127.0.0.1", server.port)
        proxies = [toxi.create(name=f"n5-{n.name}", upstream=f"127.0.0.1:{n.port}") for n in hub.nodes]
        slow = proxies[list(hub.nodes).index(master)]
        for stream in ("upstream", "downstream"):  # CONNECT reaches the master after 1 s, CONNECTED 1 s later
            slow.add_toxic(type="latency", stream=stream, name=f"lat-{stream}", attributes={"latency": latency_ms})
        leaves = ",".join(f"tcp://{p.listen}" for p in proxies)
        text = connector_toml(spoke.uri, f"masterslave:({leaves})?initialReconnectDelay=100&maxReconnectDelay=1000",
                              "nc", {"static_include": ["/queue/orders"], "heartbeat_ms": 1000})
        with BridgeAgent(parse_config(text)) as agent:
            # the bridge's handshake is in the proxy now: kill the master between its
            # CONNECTED (sent at ~1 s) and that frame's arrival at the bridge (~2 s)
            time.sleep(latency_ms * 1.5 / 1000)
            hub.kill_master()
            new_master = hub.wait_master(timeout=60)
            for stream in ("upstream", "downstream"):
                slow.destroy_toxic(f"lat-{stream}")
            errors: list[BaseException] = []
            bodies = [f"m{i}" for i in range(200)]

            def produce() -> None:
                try:
                    with amqtransport.connect(spoke.uri) as c, c.producer(window=20) as p:
                        for b in bodies:
                            p.send("/queue/orders", b, idempotency_key=b)
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            t = threading.Thread(target=produce)
            t.start()
            got: set[str] = set()
            new_proxy = f"tcp://{proxies[list(hub.nodes).index(new_master)].listen}"
            with amqtransport.connect(f"failover:({leaves})?randomize=false") as c:
                sub = c.subscribe("/queue/orders", ack="client-individual")
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and len(got) < len(bodies):
                    m = sub.receive(timeout=0.2)
                    if m is not None:
                        got.add(m.text)
                        m.ack()
            t.join(30)
            assert not errors, errors
            st = status(agent)
            missing = sorted(set(bodies) - got)
            assert not missing, (f"{len(missing)} of {len(bodies)} never reached the hub, e.g. {missing[:5]}; "
                                 f"bridge {st['state']} on {st['remote']} (new master behind {new_proxy})")


def test_scripted_remote_that_stops_receipting_bridge_is_rebuilt() -> None:
    # a far side that keeps its link up but answers no receipt (or a dead link nobody
    # noticed): the forwarder gives up after receipt_timeout_ms and the bridge is rebuilt,
    # instead of waiting for ever with the spoke's messages unacknowledged
    backend = MemoryBackend()
    spoke, hub_a, _hub_b = backend.add("s:1"), backend.add("a:1"), backend.add("b:2")
    hub_a.hold_receipts = True
    text = connector_toml("tcp://s:1", "masterslave:(tcp://a:1,tcp://b:2)?initialReconnectDelay=10", "nc",
                          {"static_include": ["/queue/orders"], "probe_interval_ms": 0, "heartbeat_ms": 0,
                           "receipt_timeout_ms": 300})

    def connect(uri: str, **kwargs: Any) -> Any:
        return amqtransport.connect(uri, backend=backend, **kwargs)

    agent = BridgeAgent(parse_config(text), connect=connect).start()
    try:
        wait_for(lambda: any(f.get("destination") == "/queue/orders" for f in spoke.frames("SUBSCRIBE")), 10,
                 "the forwarder's subscription on the spoke")
        spoke.deliver("/queue/orders", "hello", {"amq-idempotency-key": "k1"})
        wait_for(lambda: int(status(agent)["rebuilds"]) >= 1, 10, "a rebuild after the receipt timeout")
        assert "SendTimeout" in str(status(agent)["last_error"])
        assert not spoke.frames("ACK")  # never acknowledged without the far side's receipt
        # the rebuilt bridge forwards the redelivery (the scripted spoke does not
        # redeliver by itself: deliver it again) once the hub receipts again
        hub_a.hold_receipts = False
        wait_for(lambda: status(agent)["state"] == "up" and sum(
            f.get("destination") == "/queue/orders" for f in spoke.frames("SUBSCRIBE")) >= 2, 10, "a new forwarder")
        spoke.deliver("/queue/orders", "hello", {"amq-idempotency-key": "k1", "redelivered": "true"})
        wait_for(lambda: len(spoke.frames("ACK")) == 1, 10, "the redelivery forwarded and acknowledged")
        assert [f.get("amq-idempotency-key") for f in hub_a.frames("SEND")] == ["k1", "k1"]  # same key both times
    finally:
        agent.stop()
