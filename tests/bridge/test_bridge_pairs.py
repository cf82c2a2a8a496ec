"""The bridge between two master/slave pairs of our broker (BrokerPair): the issue's scenario.

Spoke pair -> bridge (masterslave:(hub-a,hub-b)) -> hub pair. SIGKILL of the hub master
under traffic: the bridge's failover gives up after one pass, the connector backs off
(initialReconnectDelay=100) and builds a new bridge on the new master; status shows its
address; every message sent on the spoke arrives at the hub exactly once (the hub pair
shares its dedupe window across the takeover, so what the dead master had stored and
the bridge sends again under the same key is dropped). Then the same with the spoke
(local side) master killed.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from bridge_helpers import wait_for

import amqtransport
from amqtransport.testing.broker_pair import BrokerPair
from bridge.agent import BridgeAgent
from bridge.config import parse_config

pytestmark = pytest.mark.timeout(240)


def producer(uri: str, bodies: list[str], errors: list[BaseException]) -> None:
    try:
        with amqtransport.connect(uri) as c, c.producer(window=50) as p:
            for b in bodies:
                p.send("/queue/orders", b)
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)


def consume_all(uri: str, expected: set[str], timeout: float) -> Counter[str]:
    """Everything that arrives at the hub, duplicates included (client dedupe off)."""
    got: Counter[str] = Counter()
    with amqtransport.connect(uri, dedupe=False) as c:
        sub = c.subscribe("/queue/orders", ack="client-individual")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not expected <= set(got):
            m = sub.receive(timeout=0.2)
            if m is not None:
                got[m.text] += 1
                m.ack()
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            m = sub.receive(timeout=0.1)
            if m is not None:
                got[m.text] += 1
                m.ack()
    return got


def assert_exactly_once(uri: str, bodies: list[str], timeout: float) -> None:
    """Every body arrived at ``uri`` once: none lost, none duplicated."""
    got = consume_all(uri, set(bodies), timeout=timeout)
    missing = set(bodies) - set(got)
    assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:5]}"
    dups = {k: n for k, n in got.items() if n > 1}
    assert not dups, f"{len(dups)} duplicated at the hub, e.g. {list(dups.items())[:5]}"


@pytest.fixture(params=["shared-store", "replicated"])
def pairs(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[tuple[BrokerPair, BrokerPair]]:
    mode = request.param
    with BrokerPair(mode, data_dir=f"{tmp_path}/spoke") as spoke, BrokerPair(mode, data_dir=f"{tmp_path}/hub") as hub:
        yield spoke, hub


def agent_for(spoke: BrokerPair, hub: BrokerPair, ack_mode: str = "client-individual") -> BridgeAgent:
    cfg = parse_config(f'''
local_uri = "failover:({spoke.a.uri},{spoke.b.uri})?randomize=false&initialReconnectDelay=50"
status_listen = "127.0.0.1:0"
[[network_connector]]
name = "spoke-to-hub"
uri = "masterslave:({hub.a.uri},{hub.b.uri})?initialReconnectDelay=100"
static_include = ["/queue/orders"]
heartbeat_ms = 1000
prefetch = 200
ack_mode = "{ack_mode}"
''')
    return BridgeAgent(cfg)


@pytest.mark.parametrize("ack_mode", ["client-individual", "client"])
def test_hub_master_killed_under_traffic_bridge_rebuilt_exactly_once(pairs: tuple[BrokerPair, BrokerPair],
                                                                     ack_mode: str) -> None:
    spoke, hub = pairs
    with agent_for(spoke, hub, ack_mode) as agent:
        def st() -> dict[str, object]:
            return agent.registry.snapshot()["bridges"][0]

        wait_for(lambda: st()["state"] == "up", 30, "bridge up")
        master = hub.wait_master()
        assert st()["remote"] == master.uri
        bodies = [f"m{i}" for i in range(3000)]
        errors: list[BaseException] = []
        t = threading.Thread(target=producer, args=(spoke.uri, bodies, errors))
        t.start()
        wait_for(lambda: int(st()["forwarded"]) >= 500, 60, "traffic flowing")  # type: ignore[call-overload]
        hub.kill_master()
        killed = time.monotonic()
        new_master = hub.other(master)
        wait_for(lambda: st()["state"] == "up" and st()["remote"] == new_master.uri, 60, "bridge rebuilt on the slave")
        print(f"[{hub.mode}] bridge up on the new hub master {time.monotonic() - killed:.2f}s after SIGKILL")
        assert int(st()["rebuilds"]) >= 1  # type: ignore[call-overload]
        t.join(120)
        assert not errors, errors
        assert_exactly_once(hub.uri, bodies, timeout=90)


def test_spoke_master_killed_bridge_keeps_forwarding_exactly_once(pairs: tuple[BrokerPair, BrokerPair]) -> None:
    spoke, hub = pairs
    with agent_for(spoke, hub) as agent:
        def st() -> dict[str, object]:
            return agent.registry.snapshot()["bridges"][0]

        wait_for(lambda: st()["state"] == "up", 30, "bridge up")
        old = spoke.wait_master()
        bodies = [f"s{i}" for i in range(2000)]
        errors: list[BaseException] = []
        t = threading.Thread(target=producer, args=(spoke.uri, bodies, errors))
        t.start()
        wait_for(lambda: int(st()["forwarded"]) >= 300, 60, "traffic flowing")  # type: ignore[call-overload]
        spoke.kill_master()
        wait_for(lambda: st()["local"] == spoke.other(old).uri, 60, "local side on the new spoke master")
        t.join(120)
        assert not errors, errors
        assert_exactly_once(hub.uri, bodies, timeout=90)


@pytest.mark.soak
@pytest.mark.timeout(900)
def test_soak_hub_master_killed_repeatedly(tmp_path: object) -> None:
    """Five SIGKILLs of whichever hub node is master, each under traffic, the killed
    node restarted as the new slave; everything arrives exactly once."""
    with BrokerPair("replicated", data_dir=f"{tmp_path}/spoke") as spoke, \
            BrokerPair("replicated", data_dir=f"{tmp_path}/hub") as hub, agent_for(spoke, hub) as agent:
        def st() -> dict[str, object]:
            return agent.registry.snapshot()["bridges"][0]

        wait_for(lambda: st()["state"] == "up", 30, "bridge up")
        bodies = [f"m{i}" for i in range(20000)]
        errors: list[BaseException] = []
        t = threading.Thread(target=producer, args=(spoke.uri, bodies, errors))
        t.start()
        for k in range(5):
            wait_for(lambda k=k: int(st()["forwarded"]) >= 2000 * (k + 1), 120, "traffic")  # type: ignore[call-overload]
            killed = hub.kill_master()
            new = hub.wait_master(60)
            wait_for(lambda new=new: st()["state"] == "up" and st()["remote"] == new.uri, 60, "rebuilt")
            hub.restart(killed)
            hub.wait_in_sync(60)
        t.join(300)
        assert not errors, errors
        assert int(st()["rebuilds"]) >= 5  # type: ignore[call-overload]
        got = consume_all(hub.uri, set(bodies), timeout=180)
        assert set(got) == set(bodies) and max(got.values()) == 1
