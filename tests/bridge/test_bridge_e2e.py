"""The bridge against real brokers and the real client.

The remote "pair" here is two independent broker processes (``BrokerProcess``) behind
a ``masterslave:`` URI: SIGKILL of the one the bridge is connected to exercises exactly
the rebuild path of a master/slave takeover (the failover under the bridge gives up
after one pass, the connector tears the bridge down, backs off and builds a new one
on the node that now accepts connections). Independent nodes do not share a store nor
a dedupe window, so a message whose receipt was lost in the kill may end up on both
nodes; the tests with a quiet kill assert exactly-once, the one that kills under
traffic asserts no loss and at most the in-flight window duplicated across the two
nodes (with a shared-store pair the dedupe window is shared and that goes away).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import bridge_helpers
import pytest
from bridge_helpers import connector_toml

import amqtransport
from amqtransport.broker import EmbeddedBroker
from amqtransport.testing.broker_process import BrokerProcess
from bridge.agent import BridgeAgent
from bridge.config import parse_config

pytestmark = pytest.mark.timeout(120)

DELAY_MS = 100  # static initialReconnectDelay used by these tests


def wait_for(cond: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> None:
    bridge_helpers.wait_for(cond, timeout, what)


def make_config(local: str, remote: str, **extra: object) -> str:
    extra.setdefault("static_include", ["/queue/orders"])
    extra.setdefault("heartbeat_ms", 1000)
    return connector_toml(local, remote, "spoke-to-hub", extra)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[tuple[BrokerProcess, BrokerProcess]]:
    h1 = BrokerProcess(tmp_path / "h1", args=("--name", "h1"), log_dir=tmp_path)
    h2 = BrokerProcess(tmp_path / "h2", args=("--name", "h2"), log_dir=tmp_path)
    with h1, h2:
        yield h1, h2


@pytest.fixture
def spoke() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=0, name="spoke") as b:
        yield b


@pytest.fixture
def agents() -> Iterator[list[BridgeAgent]]:
    started: list[BridgeAgent] = []
    yield started
    for a in started:
        a.stop()


def start_agent(agents: list[BridgeAgent], text: str) -> BridgeAgent:
    agent = BridgeAgent(parse_config(text))
    agents.append(agent)
    return agent.start()


def http_status(agent: BridgeAgent) -> dict[str, object]:
    assert agent.status_url is not None
    with urllib.request.urlopen(agent.status_url + "/status", timeout=5) as r:
        data = json.loads(r.read())
    return data["bridges"][0]  # type: ignore[no-any-return]


def send(uri: str, dest: str, bodies: list[str]) -> None:
    with amqtransport.connect(uri) as c, c.producer(window=100) as p:
        for b in bodies:
            p.send(dest, b)


def drain(uri: str, dest: str, *, expect: int, timeout: float = 20.0, grace: float = 0.5) -> list[str]:
    got: list[str] = []
    with amqtransport.connect(uri) as c:
        sub = c.subscribe(dest, ack="auto")
        deadline = time.monotonic() + timeout
        while len(got) < expect and time.monotonic() < deadline:
            m = sub.receive(timeout=0.2)
            if m is not None:
                got.append(m.text)
        end = time.monotonic() + grace  # duplicates, if any, show up now
        while time.monotonic() < end:
            m = sub.receive(timeout=0.1)
            if m is not None:
                got.append(m.text)
    return got


def test_traffic_flows_and_status_over_http(spoke: EmbeddedBroker, hub: tuple[BrokerProcess, BrokerProcess],
                                           agents: list[BridgeAgent]) -> None:
    h1, h2 = hub
    agent = start_agent(agents, make_config(spoke.uri, f"masterslave:({h1.uri},{h2.uri})?initialReconnectDelay={DELAY_MS}"))
    wait_for(lambda: http_status(agent)["state"] == "up", what="bridge up")
    send(spoke.uri, "/queue/orders", [f"m{i}" for i in range(300)])
    got = drain(h1.uri, "/queue/orders", expect=300)
    assert Counter(got) == Counter(f"m{i}" for i in range(300))
    st = http_status(agent)
    assert (st["state"], st["remote"], st["forwarded"], st["rebuilds"]) == ("up", h1.uri, 300, 0)
    with urllib.request.urlopen(str(agent.status_url) + "/metrics", timeout=5) as r:
        metrics = r.read().decode()
    assert 'amq_bridge_forwarded_total{bridge="spoke-to-hub"} 300' in metrics


def test_sigkill_remote_bridge_rebuilt_on_other_node_exactly_once(
        spoke: EmbeddedBroker, hub: tuple[BrokerProcess, BrokerProcess], agents: list[BridgeAgent],
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="bridge.connector")
    h1, h2 = hub
    agent = start_agent(agents, make_config(spoke.uri, f"masterslave:({h1.uri},{h2.uri})?initialReconnectDelay={DELAY_MS}"))
    wait_for(lambda: http_status(agent)["state"] == "up", what="bridge up")
    first = [f"a{i}" for i in range(200)]
    send(spoke.uri, "/queue/orders", first)
    wait_for(lambda: http_status(agent)["forwarded"] == 200, what="first batch forwarded")

    h1.kill()
    killed_at = time.monotonic()
    wait_for(lambda: http_status(agent)["remote"] == h2.uri, what="bridge rebuilt on h2")
    rebuild_s = time.monotonic() - killed_at
    st = http_status(agent)
    assert st["state"] == "up" and st["rebuilds"] == 1 and st["last_error"]
    # within the static backoff: first re-add after initialReconnectDelay (+ heart-beat
    # detection and one connect); generous bound for a loaded 2-core machine
    assert rebuild_s < 10, rebuild_s
    print(f"bridge rebuilt {rebuild_s * 1000:.0f} ms after SIGKILL of the connected remote")
    logs = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"bridge spoke-to-hub down (was on {h1.uri})") for m in logs), logs
    assert any(m.startswith(f"bridge spoke-to-hub rebuilt (rebuild #1): {spoke.uri} -> {h2.uri}") and f"was {h1.uri}" in m
               for m in logs), logs

    second = [f"b{i}" for i in range(200)]
    send(spoke.uri, "/queue/orders", second)
    on_h2 = drain(h2.uri, "/queue/orders", expect=200)
    h1.restart()
    on_h1 = drain(h1.uri, "/queue/orders", expect=200)
    assert Counter(on_h1) == Counter(first)
    assert Counter(on_h2) == Counter(second)
    assert drain(spoke.uri, "/queue/orders", expect=0, timeout=0.1) == []


def test_sigkill_remote_under_traffic_loses_nothing(
        spoke: EmbeddedBroker, hub: tuple[BrokerProcess, BrokerProcess], agents: list[BridgeAgent]) -> None:
    h1, h2 = hub
    prefetch = 50
    agent = start_agent(agents, make_config(spoke.uri, f"masterslave:({h1.uri},{h2.uri})?initialReconnectDelay={DELAY_MS}",
                                            prefetch=prefetch))
    wait_for(lambda: http_status(agent)["state"] == "up", what="bridge up")
    total = 2000
    bodies = [f"m{i}" for i in range(total)]
    sender = threading.Thread(target=send, args=(spoke.uri, "/queue/orders", bodies))
    sender.start()
    wait_for(lambda: http_status(agent)["forwarded"] >= 300, what="traffic flowing")
    h1.kill()
    sender.join(60)
    wait_for(lambda: http_status(agent)["remote"] == h2.uri, what="rebuilt on h2")
    wait_for(lambda: agent.registry.snapshot()["bridges"][0]["forwarded"] >= total - 300, timeout=60, what="drained")
    on_h2 = drain(h2.uri, "/queue/orders", expect=total, timeout=10)
    h1.restart()
    on_h1 = drain(h1.uri, "/queue/orders", expect=1, timeout=5)
    both = Counter(on_h1) + Counter(on_h2)
    assert set(both) == set(bodies), f"lost: {sorted(set(bodies) - set(both))[:10]}"
    assert max(Counter(on_h2).values()) == 1 and max(Counter(on_h1).values()) == 1
    dup = sum(n - 1 for n in both.values())
    assert dup <= prefetch, dup  # only what was in flight when h1 died, on two independent nodes


def test_seed_pitfall_self_reconnecting_failover_status_shows_actual_address(
        spoke: EmbeddedBroker, hub: tuple[BrokerProcess, BrokerProcess], agents: list[BridgeAgent]) -> None:
    """static:failover:(h1,h2) without maxReconnectAttempts=0: the failover reconnects by
    itself, the bridge is never rebuilt and its identity (service, rebuilds=0) is stale,
    like ActiveMQ's MBean name in the seed. Our status still reports the address the
    connection is actually on."""
    h1, h2 = hub
    agent = start_agent(agents, make_config(
        spoke.uri, f"static:failover:({h1.uri},{h2.uri})?randomize=false&initialReconnectDelay=50"))
    wait_for(lambda: http_status(agent)["state"] == "up", what="bridge up")
    assert http_status(agent)["remote"] == h1.uri
    h1.kill()
    wait_for(lambda: http_status(agent)["remote"] == h2.uri, what="status follows the connection")
    st = http_status(agent)
    assert st["rebuilds"] == 0, "never rebuilt: this is the stale bridge of the seed"
    assert h1.uri in str(st["service"]) and st["remote"] != h1.uri
    send(spoke.uri, "/queue/orders", ["after"])
    assert drain(h2.uri, "/queue/orders", expect=1) == ["after"]


def test_local_side_failover(tmp_path: Path, hub: tuple[BrokerProcess, BrokerProcess],
                             agents: list[BridgeAgent]) -> None:
    h1, _ = hub
    with BrokerProcess(tmp_path / "s1", args=("--name", "s1"), log_dir=tmp_path) as s1, \
            BrokerProcess(tmp_path / "s2", args=("--name", "s2"), log_dir=tmp_path) as s2:
        local = f"failover:({s1.uri},{s2.uri})?randomize=false&initialReconnectDelay=50"
        agent = start_agent(agents, make_config(local, f"masterslave:({h1.uri},tcp://127.0.0.1:9)"))
        wait_for(lambda: http_status(agent)["state"] == "up", what="bridge up")
        send(s1.uri, "/queue/orders", [f"a{i}" for i in range(100)])
        wait_for(lambda: http_status(agent)["forwarded"] == 100, what="forwarded from s1")
        s1.kill()
        wait_for(lambda: http_status(agent)["local"] == s2.uri, what="local side on s2")
        send(s2.uri, "/queue/orders", [f"b{i}" for i in range(100)])
        got = drain(h1.uri, "/queue/orders", expect=200)
        assert Counter(got) == Counter([f"a{i}" for i in range(100)] + [f"b{i}" for i in range(100)])
        assert http_status(agent)["rebuilds"] == 0  # the local failover hid it, as it should


def test_duplex_never_loops(tmp_path: Path, agents: list[BridgeAgent]) -> None:
    with EmbeddedBroker(port=0, name="a") as a, EmbeddedBroker(port=0, name="b") as b:
        agent = start_agent(agents, make_config(a.uri, f"masterslave:({b.uri},tcp://127.0.0.1:9)",
                                                static_include=["/topic/news", "/queue/orders"], duplex=True,
                                                network_ttl=5, loop_pause_ms=200))
        wait_for(lambda: len(agent.registry.snapshot()["bridges"][0]["destinations"]) == 4, what="4 forwarders")
        with amqtransport.connect(a.uri) as ca, amqtransport.connect(b.uri) as cb:
            sa = ca.subscribe("/topic/news")
            sb = cb.subscribe("/topic/news")
            ca.send("/topic/news", "from-a")
            cb.send("/topic/news", "from-b")

            def collect(sub: amqtransport.Subscription) -> list[str]:  # type: ignore[name-defined]
                out = []
                end = time.monotonic() + 1.5
                while time.monotonic() < end:
                    m = sub.receive(timeout=0.1)
                    if m is not None:
                        out.append(m.text)
                return out

            assert sorted(collect(sa)) == ["from-a", "from-b"]
            assert sorted(collect(sb)) == ["from-a", "from-b"]
        # a queue message crosses once and stays on the far side for its consumers
        send(a.uri, "/queue/orders", [f"q{i}" for i in range(20)])
        wait_for(lambda: agent.registry.snapshot()["bridges"][0]["forwarded"] >= 22, what="queue forwarded")
        assert Counter(drain(b.uri, "/queue/orders", expect=20, timeout=10)) == Counter(f"q{i}" for i in range(20))
        snap = agent.registry.snapshot()["bridges"][0]
        assert snap["forwarded"] == 22 and snap["suppressed"] >= 2


def test_dynamic_include_follows_hub_consumers(spoke: EmbeddedBroker, agents: list[BridgeAgent]) -> None:
    with EmbeddedBroker(port=0, name="hub") as hub:
        agent = start_agent(agents, make_config(spoke.uri, f"masterslave:({hub.uri},tcp://127.0.0.1:9)",
                                                static_include=[], dynamic_include=["/queue/events.>"],
                                                exclude=["/queue/events.local"]))
        wait_for(lambda: agent.registry.snapshot()["bridges"][0]["state"] == "up")
        send(spoke.uri, "/queue/events.eu", ["early"])
        time.sleep(0.5)
        assert agent.registry.snapshot()["bridges"][0]["destinations"] == []  # no demand yet: stays local
        with amqtransport.connect(hub.uri) as c:
            sub = c.subscribe("/queue/events.eu", ack="auto")
            c.subscribe("/queue/events.local", ack="auto")
            m = sub.receive(timeout=10)
            assert m is not None and m.text == "early"
            assert agent.registry.snapshot()["bridges"][0]["destinations"] == ["local->remote /queue/events.eu"]
        wait_for(lambda: agent.registry.snapshot()["bridges"][0]["destinations"] == [], what="demand gone")


def test_cli_run_logs_and_stops_cleanly(tmp_path: Path, spoke: EmbeddedBroker) -> None:
    from amqtransport.testing.ports import free_port

    with EmbeddedBroker(port=0, name="hub") as hub:
        port = free_port()
        cfg = tmp_path / "bridge.toml"
        cfg.write_text(make_config(spoke.uri, f"masterslave:({hub.uri},tcp://127.0.0.1:9)").replace(
            'status_listen = "127.0.0.1:0"', f'status_listen = "127.0.0.1:{port}"'))
        proc = subprocess.Popen([sys.executable, "-m", "amqtransport", "bridge", "run", str(cfg)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        lines: list[str] = []
        try:
            assert proc.stdout is not None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                lines.append(line)
                if " up: " in line:
                    break
            assert any(f"bridge spoke-to-hub up: {spoke.uri} -> {hub.uri}" in ln for ln in lines), "".join(lines)
            out = subprocess.run([sys.executable, "-m", "amqtransport", "bridge", "status", "--url",
                                  f"http://127.0.0.1:{port}"], capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, out.stderr
            row = out.stdout.splitlines()[1].split()
            assert row[:3] == ["spoke-to-hub", "up", hub.uri]
            proc.send_signal(signal.SIGTERM)
            rest, _ = proc.communicate(timeout=30)
            assert proc.returncode == 0, rest
            assert "bridge agent stopped" in rest
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_cli_run_bad_config_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('local_uri = "tcp://127.0.0.1:1"\n[[network_connector]]\nname = "x"\nuri = "tcp://127.0.0.1:2"\n'
                   'static_include = ["/queue/a"]\nnetwork_ttl = 0\n')
    out = subprocess.run([sys.executable, "-m", "amqtransport", "bridge", "run", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "network_connector[0].network_ttl: must be >= 1" in out.stderr


def test_probe_rebuilds_as_soon_as_the_new_master_accepts(tmp_path: Path, spoke: EmbeddedBroker,
                                                         agents: list[BridgeAgent]) -> None:
    """With a long static back-off (initialReconnectDelay=5000) the agent alone would
    re-add the service only seconds after the new node is up; the TCP prober adds it
    about probe_interval_ms after the node accepts connections."""
    from amqtransport.testing.ports import free_port

    h2_port = free_port()
    with BrokerProcess(tmp_path / "h1", args=("--name", "h1"), log_dir=tmp_path) as h1, \
            BrokerProcess(tmp_path / "h2", port=h2_port, args=("--name", "h2"), log_dir=tmp_path) as h2:
        agent = start_agent(agents, make_config(
            spoke.uri, f"masterslave:({h1.uri},tcp://127.0.0.1:{h2_port})?initialReconnectDelay=5000",
            probe_interval_ms=100))
        h2.kill()  # the "slave" is not serving yet
        wait_for(lambda: http_status(agent)["remote"] == h1.uri, what="bridge up on h1")
        h1.kill()
        wait_for(lambda: http_status(agent)["state"] != "up", what="bridge down")
        time.sleep(1.0)  # the agent's re-add is 5 s away
        h2.start()
        up = time.monotonic()
        wait_for(lambda: http_status(agent)["remote"] == h2.uri, timeout=3.0, what="bridge rebuilt on h2 early")
        print(f"bridge up on h2 {time.monotonic() - up:.3f}s after it accepted connections (back-off was 5 s)")
        send(spoke.uri, "/queue/orders", ["after"])
        assert drain(h2.uri, "/queue/orders", expect=1) == ["after"]


def test_static_list_one_bridge_per_broker(spoke: EmbeddedBroker, agents: list[BridgeAgent]) -> None:
    """static:(h1,h2): ActiveMQ's plain static network connector: a bridge to each
    broker (named spoke-to-hub#1 and #2), the spoke's queue consumed by both."""
    with EmbeddedBroker(port=0, name="h1") as h1, EmbeddedBroker(port=0, name="h2") as h2:
        agent = start_agent(agents, make_config(spoke.uri, f"static:({h1.uri},{h2.uri})?initialReconnectDelay=100",
                                                prefetch=10))
        snap = lambda: {b["name"]: b for b in agent.registry.snapshot()["bridges"]}  # noqa: E731
        wait_for(lambda: all(b["state"] == "up" for b in snap().values()), what="both bridges up")
        assert {n: b["remote"] for n, b in snap().items()} == {"spoke-to-hub#1": h1.uri, "spoke-to-hub#2": h2.uri}
        bodies = [f"m{i}" for i in range(400)]
        send(spoke.uri, "/queue/orders", bodies)
        wait_for(lambda: sum(int(b["forwarded"]) for b in snap().values()) == 400, what="all forwarded")
        got = drain(h1.uri, "/queue/orders", expect=1, timeout=2) + drain(h2.uri, "/queue/orders", expect=1, timeout=2)
        assert Counter(got) == Counter(bodies)
        assert all(int(b["forwarded"]) > 0 for b in snap().values())  # both bridges carried traffic


def test_duplex_dynamic_follows_real_consumers_only(agents: list[BridgeAgent]) -> None:
    with EmbeddedBroker(port=0, name="a") as a, EmbeddedBroker(port=0, name="b") as b:
        agent = start_agent(agents, make_config(a.uri, f"masterslave:({b.uri},tcp://127.0.0.1:9)", static_include=[],
                                                dynamic_include=["/queue/jobs.>"], duplex=True, network_ttl=3))

        def dests() -> list[str]:
            return agent.registry.snapshot()["bridges"][0]["destinations"]  # type: ignore[no-any-return]

        wait_for(lambda: agent.registry.snapshot()["bridges"][0]["state"] == "up", what="up")
        with amqtransport.connect(b.uri) as cb:
            sub = cb.subscribe("/queue/jobs.x", ack="auto")
            wait_for(lambda: dests() == ["local->remote /queue/jobs.x"], what="forward demand")
            time.sleep(0.5)
            assert dests() == ["local->remote /queue/jobs.x"]  # our own consumer on a is not demand
            send(a.uri, "/queue/jobs.x", [f"j{i}" for i in range(10)])
            got = [m.text for m in (sub.receive(timeout=5) for _ in range(10)) if m is not None]
            assert sorted(got) == sorted(f"j{i}" for i in range(10))
        wait_for(lambda: dests() == [], what="demand gone")


def test_ring_of_three_never_loops(agents: list[BridgeAgent]) -> None:
    """A -> B -> C -> A, network_ttl 5, a topic and a queue: each broker's subscribers see a
    topic message once, and the queue message goes round until it would re-enter a
    broker on its path, then stays where it is."""
    with EmbeddedBroker(port=0, name="a") as a, EmbeddedBroker(port=0, name="b") as b, \
            EmbeddedBroker(port=0, name="c") as c:
        ring = [(a, b), (b, c), (c, a)]
        for src, dst in ring:
            start_agent(agents, make_config(src.uri, f"masterslave:({dst.uri},tcp://127.0.0.1:9)",
                                            static_include=["/topic/news", "/queue/work"], network_ttl=5,
                                            loop_pause_ms=300))
        wait_for(lambda: all(ag.registry.snapshot()["bridges"][0]["state"] == "up" for ag in agents), what="ring up")
        time.sleep(0.3)
        conns = [amqtransport.connect(x.uri) for x in (a, b, c)]
        try:
            subs = [cn.subscribe("/topic/news") for cn in conns]
            conns[0].send("/topic/news", "hello")
            seen: list[list[str]] = [[], [], []]
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                for i, sub in enumerate(subs):
                    m = sub.receive(timeout=0.03)
                    if m is not None:
                        seen[i].append(m.text)
            assert seen == [["hello"], ["hello"], ["hello"]]
            conns[0].send("/queue/work", "job")
            # a -> b -> c; c -> a is refused (a is on the path): the job waits on c
            q = conns[2].subscribe("/queue/work", ack="auto")
            m = q.receive(timeout=10)
            assert m is not None and m.text == "job"
            assert m.headers["amq-network-hops"] == "2"
            assert drain(a.uri, "/queue/work", expect=0, timeout=0.1, grace=1.0) == []
            assert drain(b.uri, "/queue/work", expect=0, timeout=0.1, grace=0.5) == []
        finally:
            for cn in conns:
                cn.close()
        forwarded = [ag.registry.snapshot()["bridges"][0]["forwarded"] for ag in agents]
        assert forwarded == [2, 2, 0], forwarded  # news + job: a->b, b->c; nothing back into a
