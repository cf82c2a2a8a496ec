"""A shared-store pair (``amq broker run --ha shared-store``, two real processes on one
data directory), each node with its HTTP side port: each console shows the other node
(the master its standby waiting on the store lock, the standby the master, with its
console link), and a SIGKILL of the master is counted as a takeover by the node that
gets the lock -- in ``/api/overview``, on the page and in ``amq_ha_takeovers_total`` --
while the node that took a free lock at start counts none."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from http_helpers import Console, metric, send, wait_http

from amqtransport.testing.broker_pair import BrokerPair
from amqtransport.testing.ports import free_port
from amqtransport.testing.wait import wait_for


class _NoProcess:  # Console wants a process for its uri/log only
    uri = ""

    def log_text(self) -> str:
        return ""


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[BrokerPair, Console, Console]]:
    ports = free_port(), free_port()
    pair = BrokerPair("shared-store", tmp_path / "pair", lock_interval=0.1,
                      master_args=["--http", f"127.0.0.1:{ports[0]}"],
                      slave_args=["--http", f"127.0.0.1:{ports[1]}"])
    with pair:
        for port in ports:
            wait_http(port)
        yield pair, Console(_NoProcess(), ports[0]), Console(_NoProcess(), ports[1])  # type: ignore[arg-type]


def _nodes(console: Console) -> dict[str, Any]:
    return {n["name"]: n for n in console.json("/api/overview")["nodes"]}


def _node_if(console: Console, name: str, *, reachable: bool) -> dict[str, Any] | None:
    """Node ``name`` on ``console``'s overview once its reachability is as given."""
    node: dict[str, Any] = _nodes(console)[name]
    return node if node["reachable"] is reachable else None


def test_shared_store_consoles_show_both_nodes_and_count_the_takeover(
    shared: tuple[BrokerPair, Console, Console],
) -> None:
    pair, a, b = shared
    # the master (a) sees its standby, which waits on the store lock ...
    nodes = _nodes(a)
    assert set(nodes) == {"a", "b"}, nodes
    assert nodes["a"]["self"] is True and nodes["a"]["role"] == "master"
    assert nodes["b"]["reachable"] is True and nodes["b"]["role"] == "slave"
    assert nodes["b"]["peer_state"] == "waiting for the store lock"
    assert nodes["b"]["client"] == f"127.0.0.1:{pair.b.port}" and nodes["b"]["http"] == f"127.0.0.1:{b.http_port}"
    # ... and the standby sees the master, whose console its page links
    nodes = _nodes(b)
    assert nodes["b"]["self"] is True and nodes["b"]["role"] == "slave"
    assert nodes["a"]["role"] == "master" and nodes["a"]["http"] == f"127.0.0.1:{a.http_port}"
    r = b.get("/readyz")
    assert r.status_code == 503 and "waiting for the store lock" in r.text
    page = b.get("/").text
    assert f'The master is <a href="http://127.0.0.1:{a.http_port}/">a</a>' in page
    assert 'data-node="a"' in page and 'data-node="b"' in page
    # taking a free lock at start is no takeover
    assert metric(a.metrics(), "amq_ha_takeovers_total") == 0
    assert metric(b.metrics(), "amq_ha_takeovers_total") == 0
    send(pair.uri, "shared.orders", ["o1", "o2"])

    pair.a.kill()  # SIGKILL: the kernel drops a's lock, b takes it
    wait_for(lambda: b.get("/readyz").status_code == 200, 30, "b ready after the SIGKILL of a", interval=0.02)
    ov = b.json("/api/overview")
    assert ov["node"]["role"] == "master" and ov["node"]["takeovers"] == 1
    assert metric(b.metrics(), "amq_ha_takeovers_total") == 1
    assert "<th>takeovers</th><td>1</td>" in b.get("/").text
    assert b.depth("shared.orders") == 2  # the same store: nothing lost
    # (the peer's status is cached for a second)
    down = wait_for(lambda: _node_if(b, "a", reachable=False), 10, "b to see a down")
    assert down["role"] == "down" and down["client"] == f"127.0.0.1:{pair.a.port}"

    # a comes back as the standby: b's console shows it waiting; a counts no takeover
    pair.a.start()
    pair.a.wait_line("role slave", 30)
    wait_http(a.http_port)
    back = wait_for(lambda: _node_if(b, "a", reachable=True), 10, "b to see a again")
    assert back["role"] == "slave" and back["peer_state"] == "waiting for the store lock"
    assert metric(a.metrics(), "amq_ha_takeovers_total") == 0
    assert _nodes(a)["b"]["role"] == "master"
