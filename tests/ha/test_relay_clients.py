"""``--relay-port``: a node that is not master but knows a live master relays clients to
it on a port of its own; its client port stays the master's alone.

Real pairs on real sockets. A replicated slave relays while its replication link is up:
its client port refuses (ActiveMQ's behaviour) while a client on its relay port is
served by the master (CONNECTED, receipts for persistent sends, a consumer on the master
gets the messages); an HA status request on the relay port is the slave's own to answer.
A failover client whose URI lists the client ports first and the relay ports after them
connects to the master directly whenever it can -- even when it tries the slave first --
and through the slave's relay only when the master's client port is out of its reach;
SIGKILL of the master closes the relayed connection, and once the slave took over the
client is served by it directly. A shared-store standby relays while it sees the master.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from ha_helpers import raw_connect, raw_send, read_frames, refuses, wait_for

import amqtransport
from amqtransport.broker.ha.config import HaOptions, load_ha_table, options_from_kwargs
from amqtransport.broker.ha.wire import ha_request_sync
from amqtransport.testing.broker_pair import BrokerPair, HaNodeProcess
from amqtransport.testing.ports import free_port

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def relay_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerPair]:
    http = f"127.0.0.1:{free_port()}"
    with BrokerPair("replicated", tmp_path_factory.mktemp("relay"), relay=True, lock_interval=0.05,
                    slave_args=["--http", http]) as bp:
        bp.b_http = http  # type: ignore[attr-defined]
        yield bp


def _relaying(node: HaNodeProcess) -> bool:
    return bool(node.status(timeout=1.0).get("amq-ha-relay"))


def _relayed(node: HaNodeProcess) -> str | None:
    return node.status(timeout=3.0).get("amq-ha-relayed")


def _failover(*leaves: str) -> str:
    return f"failover:({','.join(leaves)})?randomize=false&initialReconnectDelay=20&maxReconnectDelay=200"


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


def test_slave_relays_on_its_relay_port_while_its_client_port_refuses(relay_pair: BrokerPair) -> None:
    bp = relay_pair
    master = bp.wait_master()
    slave = bp.wait_in_sync()
    assert slave.relay_port is not None
    wait_for(lambda: _relaying(slave), 20, "the slave's status to say it relays")
    st = slave.status()
    assert (st["amq-ha-relay"], st["amq-ha-relay-port"]) == (f"127.0.0.1:{master.port}",
                                                             f"127.0.0.1:{slave.relay_port}"), st
    assert refuses(slave.port), "the slave's client port accepts: it must be the master's alone"
    assert refuses(master.relay_port or 0), "the master binds its relay port: a master never relays"
    # an HA request on the slave's relay port is the slave's to answer, not relayed
    st = dict(ha_request_sync("127.0.0.1", slave.relay_port, 3.0).headers)
    assert (st.get("amq-ha-role"), st.get("amq-ha-name")) == ("slave", slave.name), st

    sock = raw_connect(slave.relay_port)  # CONNECTED comes from the master, through the slave
    try:
        ids = {f"r{i}" for i in range(5)}
        for i in range(5):
            raw_send(sock, "/queue/relay.test", f"relayed-{i}", receipt=f"r{i}", idempotency_key=f"relay-{i}")
        assert _receipts(sock, ids, 20) == ids
        wait_for(lambda: _relayed(slave) == "1", 10, "the relayed-connections count")
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
    assert (f"node b: relaying clients on 127.0.0.1:{slave.relay_port} to master a at 127.0.0.1:{master.port}"
            in slave.log_text())


def test_a_client_trying_the_slave_first_reaches_the_master_directly(relay_pair: BrokerPair) -> None:
    """The slave's client port first in the URI: the client is NOT relayed when it can
    reach the master's client port (on a slave relaying on its client port, it was)."""
    bp = relay_pair
    master = bp.wait_master()
    slave = bp.wait_in_sync()
    wait_for(lambda: _relaying(slave), 20, "the slave's status to say it relays")
    wait_for(lambda: _relayed(slave) == "0", 20, "no connection relayed before the test")
    uri = _failover(slave.uri, master.uri, slave.relay_uri, master.relay_uri)
    with amqtransport.connect(uri) as c:
        c.send("/queue/relay.direct", "direct")  # a receipted send: the session is up
        assert c.connected_uri == master.uri
        assert _relayed(slave) == "0", "the client went through the slave's relay"


def test_the_relay_serves_a_client_cut_from_the_master_until_the_master_dies(relay_pair: BrokerPair) -> None:
    """The master's client port out of the client's reach (a dead address in its place):
    the client falls through to the slave's relay; SIGKILL of the master closes the
    relayed connection and the client is served by the slave, now master, directly."""
    bp = relay_pair
    master = bp.wait_master()
    slave = bp.wait_in_sync()
    assert master.relay_port is not None and slave.relay_port is not None
    wait_for(lambda: _relaying(slave), 20, "the slave's status to say it relays")
    cut = f"tcp://127.0.0.1:{free_port()}"  # what the client has instead of the master's client port
    leaves = {master.name: cut, slave.name: slave.uri}
    uri = _failover(leaves["a"], leaves["b"], bp.a.relay_uri, bp.b.relay_uri)
    with amqtransport.connect(uri) as c:
        c.send("/queue/relay.kill", "before")
        assert c.connected_uri == slave.relay_uri
        assert _relayed(slave) == "1"
        sock = raw_connect(slave.relay_port)
        try:
            raw_send(sock, "/queue/relay.kill", "raw", receipt="b0", idempotency_key="kill-0")
            assert _receipts(sock, {"b0"}, 20) == {"b0"}
            master.kill()
            _frames, closed = read_frames(sock, time.monotonic() + 30)
            assert closed, "the relayed connection stayed open after the master was killed"
        finally:
            sock.close()
        assert bp.wait_master(60) is slave
        c.send("/queue/relay.kill", "after")  # the failover client reconnects: to the new master itself
        assert c.connected_uri == slave.uri
    assert "stopped relaying clients to master a" in slave.log_text()
    st = dict(ha_request_sync("127.0.0.1", slave.port, 3.0).headers)
    assert (st.get("amq-ha-role"), st.get("amq-ha-relay")) == ("master", None), st
    assert refuses(slave.relay_port), "the new master still binds its relay port"
    with amqtransport.connect(f"tcp://127.0.0.1:{slave.port}") as c:
        sub = c.subscribe("/queue/relay.kill")
        got = {m.text for m in (sub.receive(timeout=20) for _ in range(3)) if m is not None}
    assert got == {"before", "raw", "after"}


def test_shared_store_standby_relays_while_it_sees_the_master(tmp_path: Path) -> None:
    with BrokerPair("shared-store", tmp_path, relay=True, lock_interval=0.05) as bp:
        master = bp.wait_master()
        standby = bp.other(master)
        wait_for(lambda: _relaying(standby), 20, "the standby's status to say it relays")
        assert refuses(standby.port) and standby.relay_port is not None
        sock = raw_connect(standby.relay_port)
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


def test_relay_port_option_and_config_key(tmp_path: Path) -> None:
    from amqtransport.errors import ConfigError

    cfg = tmp_path / "node.toml"
    cfg.write_text('[ha]\nmode = "shared-store"\nrelay_port = 61700\n')
    table = load_ha_table(cfg)
    assert table["relay_port"] == 61700
    assert options_from_kwargs(table).relay_port == 61700
    assert HaOptions().relay_port is None
    cfg.write_text('[ha]\nrelay_port = 70000\n')
    with pytest.raises(ConfigError, match="relay_port"):
        load_ha_table(cfg)
    cfg.write_text('[ha]\nrelay_clients = true\n')  # the option it replaced is gone
    with pytest.raises(ConfigError, match="relay_clients"):
        load_ha_table(cfg)


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
        dead = free_port()
        relay = ClientRelay("b", "127.0.0.1", 0, HaPortLimits(), _NoRequests(), connect_timeout=2.0)
        await relay.relay_to("a", ("127.0.0.1", dead))
        port = relay.port  # port 0: a free one, kept from now on and named in the relay's address
        try:
            assert relay.active and port != 0 and relay.address == f"127.0.0.1:{port}"
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


def test_a_burst_of_clients_waits_in_the_relay_ports_accept_queue_while_the_node_is_busy() -> None:
    """Clients cut from the master all fall through to the relay at once. 300 connects
    made while the node's loop is busy (blocked here for 1.5 s) all complete in the
    kernel's accept queue, and the relay answers every one once the loop runs again (its
    upstream refuses here: each is closed). With asyncio's default queue of 100 the kernel
    dropped the SYNs beyond it: those clients waited for their SYN's retransmission, a
    second later (here: the 0.5 s connect timeout)."""
    import threading

    from amqtransport.broker.ha.config import HaPortLimits
    from amqtransport.broker.ha.relay import ClientRelay

    async def scenario() -> None:
        relay = ClientRelay("b", "127.0.0.1", 0, HaPortLimits(), _NoRequests(), connect_timeout=2.0)
        await relay.relay_to("a", ("127.0.0.1", free_port()))
        socks: list[socket.socket] = []
        go = threading.Event()
        failed: list[BaseException] = []

        def connect_all() -> None:
            go.wait(5)
            try:
                for _ in range(300):  # each within half the SYN retransmission timer, or not at all
                    socks.append(socket.create_connection(("127.0.0.1", relay.port), timeout=0.5))
            except OSError as exc:
                failed.append(exc)

        clients = threading.Thread(target=connect_all, daemon=True)
        clients.start()
        try:
            go.set()
            time.sleep(1.5)  # the node's loop is busy: nothing is accepted meanwhile
            await asyncio.to_thread(clients.join, 10)
            assert not failed, f"connect {len(socks) + 1} of 300 failed: {failed[0]!r}"
            for sock in socks:
                sock.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00")
            for sock in socks:
                sock.settimeout(10)
                with contextlib.suppress(ConnectionResetError):
                    assert await asyncio.to_thread(sock.recv, 16) == b""
            assert relay.refused_total == 300
        finally:
            relay.stop("test over")
            for sock in socks:
                sock.close()

    asyncio.run(scenario())


def _client_error(port: int) -> BaseException | None:
    try:
        amqtransport.connect(f"tcp://127.0.0.1:{port}").close()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc
    return None


def test_relay_port_bad_values_are_refused_naming_the_option(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from amqtransport.cli.main import cli

    run = CliRunner().invoke(cli, ["broker", "run", "--ha", "replicated", "--port", "6100", "--relay-port", "6100",
                                   "--cluster-password", "x" * 20, "--data-dir", str(tmp_path / "d")])
    assert run.exit_code == 2 and "--relay-port must differ from the client port" in run.output, run.output
    for args, says in ((["--relay-port", "6200"], "--relay-port and --slave-relay-port go together"),
                       (["--relay-port", "6200", "--slave-relay-port", "6200"], "the relay ports must differ"),
                       (["--relay-port", "70000", "--slave-relay-port", "6201"], "--relay-port must be a port number")):
        pair = CliRunner().invoke(cli, ["broker", "pair", "--data-dir", str(tmp_path / "p"), *args])
        assert pair.exit_code == 2 and says in pair.output, (args, pair.output)


def test_unwatch_ends_a_watch_whose_cancel_was_swallowed_by_wait_for() -> None:
    """A shared-store standby that takes the store lock stops watching for a master
    (``MasterWatch.unwatch``) before it opens the store. Its look may be inside 3.11's
    ``asyncio.wait_for`` when the cancel comes, in the very turn the probe's connection is
    refused (the master just died): ``wait_for`` then raises the OSError instead of the
    CancelledError, the look says "nobody answered" and the watch loops on. unwatch used
    to cancel once and wait for the task forever, the lock held, the node a slave (the
    nemesis, seed 678: no master for 60 s). It now returns and the relay is stopped."""
    from amqtransport.broker.ha.config import HaPortLimits
    from amqtransport.broker.ha.relay import ClientRelay, MasterWatch, Sighting

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        relay = ClientRelay("b", "127.0.0.1", 0, HaPortLimits(), _NoRequests(), connect_timeout=2.0)
        refused: list[asyncio.Future[None]] = []
        looks = 0

        async def look() -> Sighting:
            nonlocal looks
            looks += 1
            connecting: asyncio.Future[None] = loop.create_future()
            refused.append(connecting)
            try:  # the probe (wire.probe): a connect within a timeout
                await asyncio.wait_for(connecting, 60.0)
            except (OSError, TimeoutError):
                return None  # nobody answered
            return None

        watch = MasterWatch(relay, look, every=0.01, stale=1.0)
        watch.watch()
        while not refused:
            await asyncio.sleep(0)
        # the connect is refused in the turn the standby, having the lock, stops watching
        refused[-1].set_exception(ConnectionRefusedError(111, "Connection refused"))
        unwatch = loop.create_task(watch.unwatch("this node took the store lock"))
        done, _ = await asyncio.wait([unwatch], timeout=2.0)
        assert unwatch in done, "unwatch waits for a watch that goes on looking"
        await unwatch
        seen = looks
        for connecting in refused:  # whatever the watch could still be waiting for
            if not connecting.done():
                connecting.set_exception(ConnectionRefusedError(111, "Connection refused"))
        await asyncio.sleep(0.1)
        assert looks == seen, "the watch still looks for a master after unwatch returned"
        assert not relay.active

    asyncio.run(scenario())
