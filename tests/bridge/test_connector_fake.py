"""The connector's state machine against an in-memory client/broker double (tests/bridge/bridge_fakes.py).

These run in well under a second each and pin down: rebuild after the remote master
dies (masterslave), the seed's stale-identity pitfall, one bridge per static service,
duplex and ring loop prevention, network_ttl, demand from consumer advisories, and
exactly-once arrival with the idempotency key. The same scenarios run against real
brokers in test_bridge_e2e.py.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator

import bridge_helpers
import pytest
from bridge_fakes import FakeNet, FakePair, drain
from bridge_helpers import connector_toml
from hypothesis import given
from hypothesis import strategies as st

from bridge.agent import BridgeAgent
from bridge.config import parse_config
from bridge.forwarder import HOPS_HEADER, PATH_HEADER, NodeId, derive_key, forward_headers, route

S1, S2 = "tcp://127.0.0.1:10001", "tcp://127.0.0.1:10002"
H1, H2 = "tcp://127.0.0.1:20001", "tcp://127.0.0.1:20002"


def wait_for(cond: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
    bridge_helpers.wait_for(cond, timeout, what)


def config(local: str, remote: str, **extra: object) -> str:
    extra.setdefault("static_include", ["/queue/orders"])
    extra.setdefault("probe_interval_ms", 0)  # fake addresses: no TCP probing
    return connector_toml(local, remote, "nc", extra)


@pytest.fixture
def net() -> FakeNet:
    return FakeNet()


@pytest.fixture
def agents() -> Iterator[list[BridgeAgent]]:
    started: list[BridgeAgent] = []
    yield started
    for a in started:
        a.stop()


def start(agents: list[BridgeAgent], net: FakeNet, text: str) -> BridgeAgent:
    agent = BridgeAgent(parse_config(text), connect=net.connect)
    agents.append(agent)
    return agent.start()


def status(agent: BridgeAgent, name: str = "nc") -> dict[str, object]:
    return next(b for b in agent.registry.snapshot()["bridges"] if b["name"] == name)


def send(net: FakeNet, uri: str, dest: str, n: int, start_at: int = 0) -> None:
    conn = net.connect(uri)
    for i in range(start_at, start_at + n):
        conn.send(dest, f"m{i}".encode())
    conn.close()


def bodies(msgs: list) -> Counter[str]:  # type: ignore[type-arg]
    return Counter(m.body.decode() for m in msgs)


# ------------------------------------------------------------------ pure routing


def test_route_ttl_and_loops() -> None:
    a, b, c = NodeId("a"), NodeId("b"), NodeId("c")
    d = route({}, here=a, there=b, ttl=1)
    assert d.forward and d.hops == 1 and d.path == ("a",)
    on_b = {HOPS_HEADER: "1", PATH_HEADER: "a"}
    assert not route(on_b, here=b, there=c, ttl=1).forward  # ttl reached
    assert route(on_b, here=b, there=c, ttl=2).path == ("a", "b")
    back = route(on_b, here=b, there=a, ttl=5)  # duplex / ring: never back to a
    assert not back.forward and "loop" in (back.reason or "")
    assert route({HOPS_HEADER: "junk"}, here=a, there=b, ttl=1).forward


def test_pair_identity_matches_by_any_address() -> None:
    pair = NodeId.of(None, [H2, H1])
    assert pair.same_as(f"{H1}+{H2}") and pair.same_as(H2) and not pair.same_as(S1)


def test_key_reused_or_derived_stably() -> None:
    src = NodeId("s")
    assert derive_key({"amq-idempotency-key": "k1", "message-id": "x"}, source=src) == "k1"
    assert derive_key({"_AMQ_DUPL_ID": "k2"}, source=src) == "k2"
    k = derive_key({"message-id": "ID:7"}, source=src)
    assert k == derive_key({"message-id": "ID:7", "redelivered": "true"}, source=src)
    assert k != derive_key({"message-id": "ID:8"}, source=src)


# ------------------------------------------------------------------ connector


def test_masterslave_bridge_rebuilt_on_new_master_exactly_once(net: FakeNet, agents: list[BridgeAgent]) -> None:
    spoke: FakePair = net.pair(S1, S2)
    hub = net.pair(H1, H2)
    agent = start(agents, net, config(f"failover:({S1},{S2})?randomize=false",
                                      f"masterslave:({H1},{H2})?initialReconnectDelay=100"))
    wait_for(lambda: status(agent)["state"] == "up", what="bridge up")
    assert status(agent)["remote"] == H1
    send(net, f"failover:({S1},{S2})", "/queue/orders", 50)
    wait_for(lambda: status(agent)["forwarded"] == 50, what="50 forwarded")
    hub.kill_master()
    wait_for(lambda: status(agent)["state"] == "up" and status(agent)["remote"] == H2, what="rebuilt on H2")
    snap = status(agent)
    assert snap["rebuilds"] == 1 and "maxReconnectAttempts=0" in str(snap["last_error"])
    send(net, f"failover:({S1},{S2})", "/queue/orders", 50, start_at=50)
    got = drain(net.connect(f"failover:({H1},{H2})"), "/queue/orders", expect=100)
    assert bodies(got) == Counter(f"m{i}" for i in range(100))
    assert spoke.store.queues["/queue/orders"] == type(spoke.store.queues["/queue/orders"])()


@pytest.mark.parametrize("ack_mode", ["client-individual", "client"])
def test_remote_dies_with_messages_in_flight_nothing_lost_no_duplicate(
        net: FakeNet, agents: list[BridgeAgent], ack_mode: str) -> None:
    net.pair(S1, S2)
    hub = net.pair(H1, H2)
    agent = start(agents, net, config(S1, f"masterslave:({H1},{H2})?initialReconnectDelay=50", prefetch=7,
                                      ack_mode=ack_mode))
    wait_for(lambda: status(agent)["state"] == "up")
    conn = net.connect(S1)
    for i in range(400):
        conn.send("/queue/orders", f"m{i}".encode())
        if i == 150:
            hub.kill_master(takeover_delay=0.2)
    wait_for(lambda: status(agent)["remote"] == H2, what="rebuilt on H2")
    got = drain(net.connect(f"failover:({H1},{H2})"), "/queue/orders", expect=400)
    assert bodies(got) == Counter(f"m{i}" for i in range(400))
    assert status(agent)["rebuilds"] >= 1


def test_local_side_failover_keeps_forwarding_exactly_once(net: FakeNet, agents: list[BridgeAgent]) -> None:
    spoke = net.pair(S1, S2)
    net.pair(H1, H2)
    agent = start(agents, net, config(f"failover:({S1},{S2})?randomize=false", f"masterslave:({H1},{H2})"))
    wait_for(lambda: status(agent)["state"] == "up")
    conn = net.connect(f"failover:({S1},{S2})")
    for i in range(300):
        conn.send("/queue/orders", f"m{i}".encode())
        if i == 100:
            spoke.kill_master()
    got = drain(net.connect(f"failover:({H1},{H2})"), "/queue/orders", expect=300)
    assert bodies(got) == Counter(f"m{i}" for i in range(300))
    wait_for(lambda: status(agent)["local"] == S2, what="status shows the new local address")


def test_seed_pitfall_self_reconnecting_failover_keeps_a_stale_identity(
        net: FakeNet, agents: list[BridgeAgent], caplog: pytest.LogCaptureFixture) -> None:
    """static:failover:(h1,h2) WITHOUT maxReconnectAttempts=0: the failover moves to h2 by
    itself, the bridge is never rebuilt, so its identity (service, rebuilds) is stale —
    yet our status reports the address actually connected. The connector warns about
    that configuration at start."""
    net.pair(S1, S2)
    hub = net.pair(H1, H2)
    with caplog.at_level("WARNING", logger="bridge.connector"):
        agent = start(agents, net, config(S1, f"static:failover:({H1},{H2})?randomize=false"))
    assert any("reconnects by itself" in r.getMessage() for r in caplog.records)
    wait_for(lambda: status(agent)["state"] == "up")
    assert status(agent)["remote"] == H1
    hub.kill_master()
    wait_for(lambda: status(agent)["remote"] == H2, what="remote follows the connection")
    snap = status(agent)
    assert snap["rebuilds"] == 0 and snap["state"] == "up"  # never rebuilt: the stale bridge
    assert H1 in str(snap["service"])  # its identity still names the list it was built for
    send(net, S1, "/queue/orders", 5)
    got = drain(net.connect(H2), "/queue/orders", expect=5)
    assert len(got) == 5


def test_static_list_builds_one_bridge_per_service(net: FakeNet, agents: list[BridgeAgent]) -> None:
    net.pair(S1, S2)
    net.pair(H1, "tcp://127.0.0.1:20009")
    net.pair(H2, "tcp://127.0.0.1:20008")
    agent = start(agents, net, config(S1, f"static:({H1},{H2})?initialReconnectDelay=50"))
    wait_for(lambda: status(agent, "nc#1")["state"] == "up" and status(agent, "nc#2")["state"] == "up")
    assert (status(agent, "nc#1")["remote"], status(agent, "nc#2")["remote"]) == (H1, H2)
    send(net, S1, "/queue/orders", 40)
    wait_for(lambda: status(agent, "nc#1")["forwarded"] + status(agent, "nc#2")["forwarded"] == 40)


def test_unreachable_remote_is_retried_with_backoff(net: FakeNet, agents: list[BridgeAgent]) -> None:
    net.pair(S1, S2)
    agent = start(agents, net, config(S1, f"masterslave:({H1},{H2})?initialReconnectDelay=50&maxReconnectDelay=100"))
    wait_for(lambda: net.connect_calls.count(f"failover:({H1},{H2})?randomize=false&maxReconnectAttempts=0") >= 3,
             what="retries")
    assert status(agent)["state"] in ("down", "connecting")
    assert "no broker" in str(status(agent)["last_error"])
    net.pair(H1, H2)
    wait_for(lambda: status(agent)["state"] == "up", what="up once the hub exists")


def test_duplex_topic_never_loops(net: FakeNet, agents: list[BridgeAgent]) -> None:
    a = net.pair(S1, S2)
    b = net.pair(H1, H2)
    agent = start(agents, net, config(S1, f"masterslave:({H1},{H2})", static_include=["/topic/news"], duplex=True,
                                      network_ttl=5))
    wait_for(lambda: status(agent)["state"] == "up" and len(status(agent)["destinations"]) == 2)  # type: ignore[arg-type]
    sub_a = net.connect(S1).subscribe("/topic/news")
    sub_b = net.connect(H1).subscribe("/topic/news")
    net.connect(S1).send("/topic/news", b"from-a")
    net.connect(H1).send("/topic/news", b"from-b")

    def collect(sub: object) -> list[str]:
        out = []
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            m = sub.receive(timeout=0.05)  # type: ignore[attr-defined]
            if m is not None:
                out.append(m.body.decode())
        return out

    assert sorted(collect(sub_a)) == ["from-a", "from-b"]
    assert sorted(collect(sub_b)) == ["from-a", "from-b"]
    assert a.store.sends <= 10 and b.store.sends <= 10  # bounded: no ping-pong
    assert status(agent)["suppressed"] >= 2


@pytest.mark.parametrize("ack_mode", ["client-individual", "client"])
def test_duplex_queue_message_stays_where_it_arrived(net: FakeNet, agents: list[BridgeAgent], ack_mode: str) -> None:
    net.pair(S1, S2)
    net.pair(H1, H2)
    agent = start(agents, net, config(S1, f"masterslave:({H1},{H2})", duplex=True, network_ttl=5, loop_pause_ms=100,
                                      ack_mode=ack_mode))
    wait_for(lambda: status(agent)["state"] == "up" and len(status(agent)["destinations"]) == 2)  # type: ignore[arg-type]
    send(net, S1, "/queue/orders", 20)
    wait_for(lambda: status(agent)["forwarded"] >= 20)
    got = drain(net.connect(H1), "/queue/orders", expect=20, timeout=5)
    assert bodies(got) == Counter(f"m{i}" for i in range(20))
    snap = status(agent)
    assert snap["forwarded"] == 20  # nothing went back to the spoke
    assert snap["suppressed"] >= 1  # the reverse forwarder saw them and gave them back


def test_network_ttl_limits_a_chain(net: FakeNet, agents: list[BridgeAgent]) -> None:
    c1, c2 = "tcp://127.0.0.1:30001", "tcp://127.0.0.1:30002"
    net.pair(S1, S2)
    net.pair(H1, H2)
    net.pair(c1, c2)
    start(agents, net, config(S1, f"masterslave:({H1},{H2})"))
    second = start(agents, net, config(H1, f"masterslave:({c1},{c2})", network_ttl=1))
    wait_for(lambda: status(second)["state"] == "up")
    send(net, S1, "/queue/orders", 3)
    wait_for(lambda: status(second)["suppressed"] >= 1, what="ttl reached at the hub")
    # the copies stay on the hub for its own consumers
    got = drain(net.connect(H1), "/queue/orders", expect=3, timeout=5)
    assert len(got) == 3 and all(m.headers[HOPS_HEADER] == "1" for m in got)


def test_dynamic_include_follows_remote_consumers(net: FakeNet, agents: list[BridgeAgent]) -> None:
    net.pair(S1, S2)
    net.pair(H1, H2)
    agent = start(agents, net, config(S1, f"masterslave:({H1},{H2})", static_include=[],
                                      dynamic_include=["/queue/events.>"], exclude=["/queue/events.local"]))
    wait_for(lambda: status(agent)["state"] == "up")
    time.sleep(0.2)
    assert status(agent)["destinations"] == []
    hub_consumer = net.connect(H1)
    sub = hub_consumer.subscribe("/queue/events.eu", ack="auto")
    hub_consumer.subscribe("/queue/events.local", ack="auto")
    wait_for(lambda: status(agent)["destinations"] == ["local->remote /queue/events.eu"], what="demand seen")
    send(net, S1, "/queue/events.eu", 5)
    got = []
    end = time.monotonic() + 5
    while len(got) < 5 and time.monotonic() < end:
        m = sub.receive(timeout=0.1)
        if m is not None:
            got.append(m)
    assert len(got) == 5
    sub.unsubscribe()
    wait_for(lambda: status(agent)["destinations"] == [], what="demand gone")


def test_advisories_off_forwards_dynamic_includes_statically(net: FakeNet, agents: list[BridgeAgent]) -> None:
    net.pair(S1, S2)
    net.pair(H1, H2)
    agent = start(agents, net, config(S1, f"masterslave:({H1},{H2})", static_include=[],
                                      dynamic_include=["/queue/events.eu"], advisories="off"))
    wait_for(lambda: status(agent)["destinations"] == ["local->remote /queue/events.eu"])
    send(net, S1, "/queue/events.eu", 3)
    assert len(drain(net.connect(H1), "/queue/events.eu", expect=3)) == 3


def test_immediate_readd_still_rebuilds(net: FakeNet, agents: list[BridgeAgent]) -> None:
    """A discovery agent that re-adds the service at once (delay 0) must get a new
    bridge, even though the failed bridge's thread is still finishing."""
    from bridge_fakes import FakeAgent

    net.pair(S1, S2)
    hub = net.pair(H1, H2)
    agent = BridgeAgent(parse_config(config(S1, f"masterslave:({H1},{H2})")), connect=net.connect,
                        agent_factory=lambda services, options, listener: FakeAgent(list(services), options, listener,
                                                                                   delay=0.0))
    agents.append(agent)
    agent.start()
    for i in range(3):
        wait_for(lambda i=i: status(agent)["state"] == "up" and status(agent)["rebuilds"] == i, what=f"build {i + 1}")
        hub.kill_master()
    wait_for(lambda: status(agent)["state"] == "up" and status(agent)["rebuilds"] == 3, what="third rebuild")
    assert status(agent)["remote"] == H2


def test_duplex_dynamic_demand_ignores_the_bridges_own_subscriptions(net: FakeNet, agents: list[BridgeAgent]) -> None:
    """In a duplex bridge each forwarder is a consumer on its source broker; counting it
    as demand would pull every message back and forth. Only real consumers count."""
    net.pair(S1, S2)
    net.pair(H1, H2)
    agent = start(agents, net, config(S1, f"masterslave:({H1},{H2})", static_include=[],
                                      dynamic_include=["/queue/jobs"], duplex=True, network_ttl=3))
    wait_for(lambda: status(agent)["state"] == "up")
    hub_sub = net.connect(H1).subscribe("/queue/jobs", ack="auto")
    wait_for(lambda: status(agent)["destinations"] == ["local->remote /queue/jobs"], what="forward demand")
    time.sleep(0.5)  # the forwarder's own consumer on the spoke must not start the reverse direction
    assert status(agent)["destinations"] == ["local->remote /queue/jobs"]
    send(net, S1, "/queue/jobs", 10)
    got = [m for m in (hub_sub.receive(timeout=2) for _ in range(10)) if m is not None]
    assert len(got) == 10
    hub_sub.unsubscribe()
    wait_for(lambda: status(agent)["destinations"] == [], what="no demand either way")
    spoke_sub = net.connect(S1).subscribe("/queue/jobs", ack="auto")
    wait_for(lambda: status(agent)["destinations"] == ["remote->local /queue/jobs"], what="reverse demand")
    send(net, H1, "/queue/jobs", 3)
    got = [m for m in (spoke_sub.receive(timeout=2) for _ in range(3)) if m is not None]
    assert len(got) == 3


NODES = ["a", "b", "c", f"{S1}+{S2}", f"{H1}+{H2}"]


@given(st.lists(st.sampled_from(NODES), max_size=5), st.integers(min_value=0, max_value=8),
       st.sampled_from(NODES), st.sampled_from(NODES), st.integers(min_value=1, max_value=6))
def test_route_properties(path: list[str], hops: int, here_label: str, there_label: str, ttl: int) -> None:
    here, there = NodeId(here_label), NodeId(there_label)
    headers = {HOPS_HEADER: str(hops), PATH_HEADER: ",".join(path)} if path or hops else {}
    d = route(headers, here=here, there=there, ttl=ttl)
    on_path = any(there.same_as(p) for p in path)
    assert d.forward == (hops < ttl and not on_path)
    if d.forward:
        assert d.hops == hops + 1
        assert here.same_as(d.path[-1])
        assert not any(there.same_as(p) for p in d.path[:-1])
        # walking on never comes back: the next hop to any broker on the new path is refused
        nxt = forward_headers({}, d)
        for p in d.path:
            assert not route(nxt, here=there, there=NodeId(p), ttl=100).forward
