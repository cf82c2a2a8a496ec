"""``--relay-clients``: a node that is not master but knows a live master relays clients to it.

Real pairs on real sockets. A replicated slave relays while its replication link is up:
a client connected to the slave's client port is served by the master (CONNECTED,
receipts for persistent sends, a consumer on the master gets the messages); an HA
status request on that port is the slave's own to answer. SIGKILL of the master closes
the relayed connection, and the slave, once it took over, serves on the same port
directly. A shared-store standby relays while it sees the master. (Without the option
a slave's client port refuses: ``never_master`` in ``ha_helpers`` asserts it in the
partition and witness tests.)
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from ha_helpers import raw_connect, raw_send, read_frames, wait_for

import amqtransport
from amqtransport.broker.ha.config import HaOptions, load_ha_table, options_from_kwargs
from amqtransport.broker.ha.wire import ha_request_sync
from amqtransport.testing.broker_pair import BrokerPair, HaNodeProcess
from amqtransport.testing.ports import free_port

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def relay_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerPair]:
    http = f"127.0.0.1:{free_port()}"
    with BrokerPair("replicated", tmp_path_factory.mktemp("relay"), relay_clients=True, lock_interval=0.05,
                    slave_args=["--http", http]) as bp:
        bp.b_http = http  # type: ignore[attr-defined]
        yield bp


def _relaying(node: HaNodeProcess) -> bool:
    return bool(node.status(timeout=1.0).get("amq-ha-relay"))


def _receipts(sock: socket.socket, ids: set[str], timeout: float) -> set[str]:
    got: set[str] = set()
    buf = b""
    deadline = time.monotonic() + timeout
    while not ids <= got and time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        assert chunk, f"the relayed connection closed with receipts {sorted(ids - got)} missing"
        buf += chunk
        *frames, buf = buf.split(b"\x00")
        for frame in frames:
            frame = frame.lstrip(b"\r\n")
            assert not frame.startswith(b"ERROR"), frame
            if frame.startswith(b"RECEIPT"):
                for line in frame.split(b"\n"):
                    if line.startswith(b"receipt-id:"):
                        got.add(line.split(b":", 1)[1].decode())
    return got


def test_slave_relays_clients_to_its_master(relay_pair: BrokerPair) -> None:
    bp = relay_pair
    master = bp.wait_master()
    slave = bp.wait_in_sync()
    wait_for(lambda: _relaying(slave), 20, "the slave's status to say it relays")
    assert slave.status()["amq-ha-relay"] == f"127.0.0.1:{master.port}"
    # an HA request on the slave's client port is the slave's to answer, not relayed
    st = dict(ha_request_sync("127.0.0.1", slave.port, 3.0).headers)
    assert (st.get("amq-ha-role"), st.get("amq-ha-name")) == ("slave", slave.name), st

    sock = raw_connect(slave.port)  # CONNECTED comes from the master, through the slave
    try:
        ids = {f"r{i}" for i in range(5)}
        for i in range(5):
            raw_send(sock, "/queue/relay.test", f"relayed-{i}", receipt=f"r{i}", idempotency_key=f"relay-{i}")
        assert _receipts(sock, ids, 20) == ids
        wait_for(lambda: slave.status().get("amq-ha-relayed") == "1", 10, "the relayed-connections count")
        metrics = urllib.request.urlopen(f"http://{bp.b_http}/metrics", timeout=10).read().decode()  # type: ignore[attr-defined]
        assert "\namq_ha_relayed_connections 1\n" in metrics, metrics
    finally:
        sock.close()
    with amqtransport.connect(f"tcp://127.0.0.1:{master.port}") as c:
        sub = c.subscribe("/queue/relay.test")
        bodies = set()
        deadline = time.monotonic() + 20
        while len(bodies) < 5 and time.monotonic() < deadline:
            m = sub.receive(timeout=1.0)
            if m is not None:
                bodies.add(m.text)
    assert bodies == {f"relayed-{i}" for i in range(5)}
    assert "relaying clients to master a at 127.0.0.1:" in slave.log_text()


def test_master_killed_the_relayed_connection_closes_and_the_slave_serves(relay_pair: BrokerPair) -> None:
    bp = relay_pair
    master = bp.wait_master()
    slave = bp.wait_in_sync()
    wait_for(lambda: _relaying(slave), 20, "the slave's status to say it relays")
    sock = raw_connect(slave.port)
    try:
        raw_send(sock, "/queue/relay.kill", "before", receipt="b0", idempotency_key="kill-0")
        assert _receipts(sock, {"b0"}, 20) == {"b0"}
        master.kill()
        _frames, closed = read_frames(sock, time.monotonic() + 30)
        assert closed, "the relayed connection stayed open after the master was killed"
    finally:
        sock.close()
    assert bp.wait_master(60) is slave
    assert "stopped relaying clients to master a" in slave.log_text()
    st = dict(ha_request_sync("127.0.0.1", slave.port, 3.0).headers)
    assert (st.get("amq-ha-role"), st.get("amq-ha-relay")) == ("master", None), st
    direct = raw_connect(slave.port)  # served by the new master itself
    try:
        raw_send(direct, "/queue/relay.kill", "after", receipt="a0", idempotency_key="kill-1")
        assert _receipts(direct, {"a0"}, 20) == {"a0"}
    finally:
        direct.close()


def test_shared_store_standby_relays_while_it_sees_the_master(tmp_path: Path) -> None:
    with BrokerPair("shared-store", tmp_path, relay_clients=True, lock_interval=0.05) as bp:
        master = bp.wait_master()
        standby = bp.other(master)
        wait_for(lambda: _relaying(standby), 20, "the standby's status to say it relays")
        sock = raw_connect(standby.port)
        try:
            raw_send(sock, "/queue/relay.shared", "via-standby", receipt="s0", idempotency_key="shared-0")
            assert _receipts(sock, {"s0"}, 20) == {"s0"}
            with amqtransport.connect(f"tcp://127.0.0.1:{master.port}") as c:
                m = c.subscribe("/queue/relay.shared").receive(timeout=20)
                assert m is not None and m.text == "via-standby"
            master.kill()
            _frames, closed = read_frames(sock, time.monotonic() + 30)
            assert closed, "the relayed connection stayed open after the master was killed"
        finally:
            sock.close()
        assert bp.wait_master(60) is standby
        assert "stopped relaying clients to master a" in standby.log_text()


def test_relay_clients_option_and_config_key(tmp_path: Path) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text('[ha]\nmode = "shared-store"\nrelay_clients = true\n')
    table = load_ha_table(cfg)
    assert table["relay_clients"] is True
    assert options_from_kwargs(table).relay_clients is True
    assert HaOptions().relay_clients is False


class _NoRequests:
    """No HA request reaches it in this test."""

    def __init__(self) -> None:
        from amqtransport.broker.ha.port import RefusalLog

        self.refused = RefusalLog(logging.getLogger("test"))

    def handle(self, transport: asyncio.Transport, frame: object, peer: str) -> None:
        raise AssertionError("no HA request expected")


def test_a_master_port_that_does_not_accept_closes_the_client_before_any_answer() -> None:
    """The relay's upstream connect is refused: the client's connection ends with no byte
    written, which the failover client counts as a refusal (ConnectRefused)."""
    from amqtransport.broker.ha.config import HaPortLimits
    from amqtransport.broker.ha.relay import ClientRelay
    from amqtransport.errors import ConnectRefused

    async def scenario() -> None:
        port, dead = free_port(), free_port()
        relay = ClientRelay("b", "127.0.0.1", port, HaPortLimits(), _NoRequests(), connect_timeout=2.0)
        await relay.relay_to("a", ("127.0.0.1", dead))
        try:
            assert relay.active
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00")
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
            assert relay.refused_total == 1 and relay.relayed == 0
            # and the failover client's handshake takes that for a refusal
            err = await asyncio.to_thread(_client_error, port)
            assert isinstance(err, ConnectRefused), err
        finally:
            relay.stop("test over")
        assert not relay.active
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)

    asyncio.run(scenario())


def _client_error(port: int) -> BaseException | None:
    try:
        amqtransport.connect(f"tcp://127.0.0.1:{port}").close()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc
    return None
