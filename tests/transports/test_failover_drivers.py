"""The failover behaviour both drivers share, run once per driver: the thread driver
(``transports/failover.FailoverTransport``) and the asyncio driver
(``aio/failover.AsyncFailoverTransport``, run on a loop thread behind the same blocking
calls). Real brokers: a broker pair whose master is SIGKILLed, embedded brokers, and a
peer that goes silent after its handshake."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from amqtransport.aio.failover import AsyncFailoverTransport
from amqtransport.broker import EmbeddedBroker
from amqtransport.errors import HeartbeatTimeout, ReconnectExhausted, TransactionRolledBack
from amqtransport.stomp import IDEMPOTENCY_HEADER, Frame
from amqtransport.stomp.session import ack_frame
from amqtransport.testing.broker_pair import BrokerPair
from amqtransport.testing.ports import free_port
from amqtransport.testing.wait import wait_for
from amqtransport.transports.base import Receipt
from amqtransport.transports.factory import build_transport
from amqtransport.transports.failover import FailoverTransport
from amqtransport.transports.link import ConnectParams

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")


class Driver(Protocol):
    """The blocking face both drivers show these tests."""

    state: str
    generation: int
    reconnects: int
    connected_address: str | None
    last_error: BaseException | None

    def start(self) -> None: ...
    def close(self) -> None: ...
    def request(self, frame: Frame) -> Receipt: ...
    def wait(self, rec: Receipt, timeout: float | None = None) -> Frame: ...
    def subscribe(self, sub_id: str, frame: Frame) -> Receipt: ...
    def begin(self, tx_id: str) -> Receipt: ...
    def commit(self, tx_id: str) -> Receipt: ...
    def ack(self, frame: Frame, generation: int) -> bool: ...
    def on_message(self, handler: Callable[[Frame, int], None]) -> None: ...


class ThreadDriver:
    def __init__(self, uri: str, params: ConnectParams) -> None:
        transport = build_transport(uri, params)
        assert isinstance(transport, FailoverTransport)
        self.t = transport

    def __getattr__(self, name: str) -> Any:
        return getattr(self.t, name)

    def request(self, frame: Frame) -> Receipt:
        rec = self.t.request(frame)
        assert rec is not None
        return rec

    def ack(self, frame: Frame, generation: int) -> bool:
        return self.t.write_if_current(ack_frame("ACK", frame, self.t.version), generation)

    def on_message(self, handler: Callable[[Frame, int], None]) -> None:
        self.t.on_message = handler


class AsyncDriver:
    """The asyncio driver on its own loop thread, called through blocking wrappers."""

    def __init__(self, uri: str, params: ConnectParams) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-aio-loop", daemon=True)
        self.thread.start()

        async def make() -> AsyncFailoverTransport:
            return AsyncFailoverTransport.from_uri(uri, params)

        self.t = self._call(make())

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=90)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.t, name)

    def start(self) -> None:
        self._call(self.t.start())

    def close(self) -> None:
        try:
            self._call(self.t.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)

    def request(self, frame: Frame) -> Receipt:
        rec = self._call(self.t.request(frame))
        assert rec is not None
        return rec

    def wait(self, rec: Receipt, timeout: float | None = None) -> Frame:
        return self._call(self.t.wait(rec, timeout))

    def subscribe(self, sub_id: str, frame: Frame) -> Receipt:
        return self._call(self.t.subscribe(sub_id, frame))

    def begin(self, tx_id: str) -> Receipt:
        return self._call(self.t.begin(tx_id))

    def commit(self, tx_id: str) -> Receipt:
        return self._call(self.t.commit(tx_id))

    def ack(self, frame: Frame, generation: int) -> bool:
        # called from on_message, which runs on the loop thread
        return self.t.write_if_current(ack_frame("ACK", frame, self.t.version), generation)

    def on_message(self, handler: Callable[[Frame, int], None]) -> None:
        self.t.on_message = handler


DRIVERS: dict[str, Callable[[str, ConnectParams], Driver]] = {"thread": ThreadDriver, "asyncio": AsyncDriver}


@pytest.fixture(params=list(DRIVERS))
def open_driver(request: pytest.FixtureRequest) -> Iterator[Callable[..., Driver]]:
    opened: list[Driver] = []

    def make(uri: str, params: ConnectParams = ConnectParams(heartbeat=(0, 0)), start: bool = True) -> Driver:  # noqa: B008
        driver = DRIVERS[request.param](uri, params)
        opened.append(driver)
        if start:
            driver.start()
        return driver

    yield make
    for driver in opened:
        driver.close()


def send(queue: str, key: str, tx: str | None = None) -> Frame:
    headers = {"destination": queue, IDEMPOTENCY_HEADER: key, "persistent": "true"}
    if tx is not None:
        headers["transaction"] = tx
    return Frame.make("SEND", headers, key.encode())


class Inbox:
    """Records bodies; acks each message on its own link (client-individual)."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.lock = threading.Lock()
        self.bodies: list[str] = []
        driver.on_message(self.on_message)

    def on_message(self, frame: Frame, generation: int) -> None:
        with self.lock:
            self.bodies.append(frame.body.decode())
        self.driver.ack(frame, generation)

    def has(self, keys: set[str]) -> bool:
        with self.lock:
            return keys <= set(self.bodies)


def subscribe(driver: Driver, queue: str) -> None:
    sub = Frame.make("SUBSCRIBE", {"id": "s1", "destination": queue, "ack": "client-individual"})
    driver.wait(driver.subscribe("s1", sub), timeout=10)


def test_replay_and_resubscribe_across_a_master_sigkill(open_driver: Callable[..., Driver], tmp_path: Path) -> None:
    with BrokerPair("replicated", tmp_path, lock_interval=0.05) as bp:
        bp.wait_master()
        d = open_driver(bp.uri + "&initialReconnectDelay=10&maxReconnectDelay=200")
        inbox = Inbox(d)
        subscribe(d, "/queue/shared.kill")
        receipted: set[str] = set()
        for i in range(200):
            key = f"k-{i}"
            rec = d.request(send("/queue/shared.kill", key))
            if i == 100:
                bp.kill_master()  # requests in flight now are replayed on the slave
            d.wait(rec, timeout=60)
            receipted.add(key)
        assert wait_for(lambda: inbox.has(receipted), timeout=30), sorted(receipted - set(inbox.bodies))[:10]
        assert d.reconnects >= 1 and d.generation >= 2


def test_a_transaction_open_across_a_failover_is_rolled_back(open_driver: Callable[..., Driver]) -> None:
    with EmbeddedBroker(port=0) as b:
        port = b.port
        d = open_driver(f"failover:({b.uri})?initialReconnectDelay=10&maxReconnectDelay=50")
        d.wait(d.begin("tx1"), timeout=5)
        d.wait(d.request(send("/queue/shared.tx", "in-tx", tx="tx1")), timeout=5)
    with EmbeddedBroker(port=port):
        assert wait_for(lambda: d.state == "connected" and d.generation == 2, timeout=20)
        with pytest.raises(TransactionRolledBack) as info:
            d.wait(d.commit("tx1"), timeout=5)
        assert list(info.value.keys) == ["in-tx"]


def test_priority_backup_returns_to_the_first_broker(open_driver: Callable[..., Driver]) -> None:
    port_a = free_port()
    with EmbeddedBroker(port=0) as b:
        d = open_driver(f"failover:(tcp://127.0.0.1:{port_a},{b.uri})?randomize=false&priorityBackup=true"
                        "&initialReconnectDelay=10&maxReconnectDelay=50")
        assert d.connected_address == b.uri
        with EmbeddedBroker(port=port_a) as a:
            assert wait_for(lambda: d.connected_address == a.uri, timeout=20)
            d.wait(d.request(send("/queue/shared.prio", "on-a")), timeout=5)


def test_the_startup_schedule_ends_naming_its_option(open_driver: Callable[..., Driver]) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        d = open_driver(f"failover:(tcp://127.0.0.1:{port})?startupMaxReconnectAttempts=2&initialReconnectDelay=1",
                        start=False)
        with pytest.raises(ReconnectExhausted, match="startupMaxReconnectAttempts"):
            d.start()
    assert d.state == "failed"


def test_a_half_open_link_is_found_by_heart_beats(open_driver: Callable[..., Driver]) -> None:
    """The peer answers CONNECTED (heart-beats every 100 ms), then says nothing: the link
    is declared lost after two intervals; with maxReconnectAttempts=0 the waiting
    request fails instead of waiting forever."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    held: list[socket.socket] = []

    def serve() -> None:
        conn, _ = server.accept()
        held.append(conn)
        data = b""
        while b"\0" not in data:
            data += conn.recv(4096)
        conn.sendall(b"CONNECTED\nversion:1.2\nheart-beat:100,100\n\n\0")

    threading.Thread(target=serve, daemon=True).start()
    try:
        d = open_driver(f"failover:(tcp://127.0.0.1:{port})?maxReconnectAttempts=0",
                        ConnectParams(heartbeat=(100, 100)))
        rec = d.request(send("/queue/q", "k-1"))
        with pytest.raises(ReconnectExhausted) as info:
            d.wait(rec, timeout=10)
        assert isinstance(info.value.last_error, HeartbeatTimeout)
        assert d.state == "failed"
    finally:
        for conn in held:
            conn.close()
        server.close()


def test_a_reconnect_tries_the_broker_it_lost_last(open_driver: Callable[..., Driver]) -> None:
    """ActiveMQ's getConnectList: the broker whose link was lost goes to the end of the
    list. The first broker answers one CONNECTED and then hangs (a frozen master: it
    accepts connections and answers nothing); the link is lost on heart-beats and the
    reconnect must reach the second broker first, not wait out a 60 s connectTimeout
    on the hung one."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    held: list[socket.socket] = []

    def serve() -> None:
        first = True
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed by the test
                return
            held.append(conn)
            if first:
                first = False
                data = b""
                while b"\0" not in data:
                    data += conn.recv(4096)
                conn.sendall(b"CONNECTED\nversion:1.2\nheart-beat:100,100\n\n\0")

    threading.Thread(target=serve, daemon=True).start()
    try:
        with EmbeddedBroker(port=0) as b:
            d = open_driver(f"failover:(tcp://127.0.0.1:{port},{b.uri})?randomize=false"
                            "&initialReconnectDelay=10&maxReconnectDelay=50",
                            ConnectParams(heartbeat=(100, 100), connect_timeout=60))
            assert d.connected_address == f"tcp://127.0.0.1:{port}"
            assert wait_for(lambda: d.connected_address == b.uri, timeout=30), (d.state, d.connected_address)
            d.wait(d.request(send("/queue/shared.lastfirst", "k-1")), timeout=10)
    finally:
        server.close()
        for conn in held:
            conn.close()


class Relay:
    """A proxy as the chaos one is: it accepts the client first, then connects to its
    upstream; when that is refused it closes the client's connection (EOF or reset, no
    answer), else it relays both ways."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._serve, name="test-relay", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:
                client.close()
                continue
            self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), name="test-relay-pump", daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            sock.close()

    def close(self) -> None:
        self.server.close()
        for sock in self.sockets:
            sock.close()


@pytest.mark.parametrize("front", ["closed-port", "proxy"])
def test_an_unanswered_connect_is_abandoned_when_a_broker_that_refused_comes_up(
        open_driver: Callable[..., Driver], caplog: pytest.LogCaptureFixture, front: str) -> None:
    """Pass 1 tries the second endpoint, which refuses (its port closed, or a proxy in
    front of it that closes the connection with no answer), then the silent one (it
    accepts TCP, never answers CONNECT; connectTimeout 30 s). A broker starts on the
    second endpoint once the silent one holds the attempt: the client abandons the
    silent CONNECT (its socket is closed) and connects to the second, long before the
    30 s connect timeout."""
    caplog.set_level(logging.INFO, logger="amqtransport.transports.failover")
    silent = socket.create_server(("127.0.0.1", 0))  # listens and accepts, never writes
    silent.settimeout(30)
    silent_port = silent.getsockname()[1]
    port = free_port()
    relay = Relay(port) if front == "proxy" else None
    second = f"tcp://127.0.0.1:{relay.port if relay is not None else port}"
    d = open_driver(f"failover:({second},tcp://127.0.0.1:{silent_port})?randomize=false"
                    "&initialReconnectDelay=10&nested.connectTimeout=30000", start=False)
    outcome: list[BaseException | None] = []

    def start() -> None:
        try:
            d.start()
        except BaseException as exc:  # noqa: BLE001 - asserted below
            outcome.append(exc)
        else:
            outcome.append(None)

    starter = threading.Thread(target=start, name="test-start", daemon=True)
    starter.start()
    held, _ = silent.accept()  # pass 1 reached the silent endpoint: the second one refused
    try:
        held.settimeout(30)
        with EmbeddedBroker(port=port):
            starter.join(20)
            assert outcome == [None], "the client still sits on the silent CONNECT" if not outcome else outcome
            assert d.connected_address == second
            received = b""
            while chunk := held.recv(4096):  # the abandoned attempt's socket is closed (EOF)
                received += chunk
            assert received.startswith((b"CONNECT", b"STOMP"))
            assert f"{second} accepts connections while the CONNECT to " \
                   f"tcp://127.0.0.1:{silent_port} is unanswered: connecting there" in caplog.text
            d.wait(d.request(send("/queue/shared.race", "after-race")), timeout=10)
    finally:
        held.close()
        silent.close()
        if relay is not None:
            relay.close()
