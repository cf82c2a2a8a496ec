"""The TCP probe of the back-off (transports/probe.py): a wait is cut short by the first
endpoint that accepts; a probe-cut attempt that fails leaves the next wait whole; the
option turns it off; the failover transport connects about one probe after a broker
starts listening, long before its back-off ends (real broker process)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import pytest

import amqtransport
from amqtransport._backends.base import leaf_address
from amqtransport._backends.memory import MemoryBackend
from amqtransport.options import FailoverOptions
from amqtransport.stomp.session import ClientSession
from amqtransport.testing.broker_process import BrokerProcess
from amqtransport.transports.aio_link import async_tcp_probe
from amqtransport.transports.failover import FailoverTransport
from amqtransport.transports.probe import ConnectRace, open_probing, tcp_probe, wait_probing
from amqtransport.uri import LeafUri, parse_uri

pytestmark = pytest.mark.timeout(60)


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_wait_is_cut_by_the_first_endpoint_that_accepts() -> None:
    t = FakeTime()
    up_at = {"a": 99.0, "b": 0.35}
    got = wait_probing(5.0, ["a", "b"], lambda e, _timeout: t.now >= up_at[e], every=0.1,
                       sleep=t.sleep, clock=t.clock)
    assert got == "b"
    assert t.now == pytest.approx(0.4)


def test_wait_runs_whole_without_probe_or_interval_and_stops_on_request() -> None:
    t = FakeTime()
    assert wait_probing(2.0, ["a"], lambda e, _t: False, every=0.1, sleep=t.sleep, clock=t.clock) is None
    assert t.now == pytest.approx(2.0)
    t = FakeTime()
    assert wait_probing(2.0, ["a"], None, every=0.1, sleep=t.sleep, clock=t.clock) is None
    assert t.sleeps == [2.0]
    t = FakeTime()
    assert wait_probing(2.0, ["a"], lambda e, _t: True, every=0, sleep=t.sleep, clock=t.clock) is None
    assert t.sleeps == [2.0]
    t = FakeTime()
    assert wait_probing(2.0, ["a"], lambda e, _t: True, every=0.1, sleep=t.sleep, clock=t.clock,
                        stop=lambda: True) is None
    assert t.now == 0.0


def test_an_instant_sleep_on_a_real_clock_ends_when_the_sleeps_add_up() -> None:
    calls: list[float] = []
    assert wait_probing(30.0, ["a"], lambda e, _t: False, every=0.1, sleep=calls.append,
                        clock=time.monotonic) is None
    assert sum(calls) == pytest.approx(30.0)


def test_tcp_probe_sees_a_listening_port_and_not_a_closed_one() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert tcp_probe(LeafUri("tcp", "127.0.0.1", port), 0.5)
    assert not tcp_probe(LeafUri("tcp", "127.0.0.1", port), 0.5)
    assert not tcp_probe(LeafUri("vm", "", 0, name="x"), 0.5)


def test_tcp_probe_works_in_a_process_with_more_than_1024_descriptors() -> None:
    """The probe's settle wait used ``select.select()``, which raises ValueError
    ("filedescriptor out of range in select()", not an OSError) for a socket numbered
    1024 or more: in a client process with that many files or sockets open, every probe
    failed (seen when a test left ~20,000 descriptors open)."""
    spare = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with socket.create_server(("127.0.0.1", 0)) as server:
            assert server.fileno() >= 1024
            port = server.getsockname()[1]
            assert tcp_probe(LeafUri("tcp", "127.0.0.1", port), 0.5)
        assert not tcp_probe(LeafUri("tcp", "127.0.0.1", port), 0.5)
    finally:
        for fd in spare:
            os.close(fd)


def _transport(backend: MemoryBackend, t: FakeTime, probe: object, **options: object) -> FailoverTransport:
    leaves = list(parse_uri("failover:(tcp://a:1,tcp://b:1)").leaves())
    opts = FailoverOptions.model_validate({"randomize": False, "initialReconnectDelay": 1000,
                                           "useExponentialBackOff": False, "maxReconnectAttempts": 4, **options})
    return FailoverTransport(leaves, opts, backend=backend, sleep=t.sleep, clock=t.clock,
                             probe=probe)  # type: ignore[arg-type]


def test_failover_connects_to_the_probed_endpoint_before_the_backoff_ends() -> None:
    backend = MemoryBackend()
    t = FakeTime()

    def probe(leaf: LeafUri, _timeout: float) -> bool:
        if leaf.host == "b" and t.now >= 0.3:  # b starts listening 0.3 s into the wait
            if "b:1" not in backend.brokers:
                backend.add("tcp://b:1")
            return True
        return False

    transport = _transport(backend, t, probe)
    transport.start()
    try:
        assert transport.connected_address == "tcp://b:1"
        assert t.now == pytest.approx(0.3)
        assert backend.connect_log == ["a:1", "b:1", "b:1"]
    finally:
        transport.close()


def test_a_probe_cut_attempt_that_fails_leaves_the_next_wait_whole() -> None:
    backend = MemoryBackend()  # nothing ever answers the handshake
    t = FakeTime()
    transport = _transport(backend, t, lambda leaf, _timeout: leaf.host == "b")
    with pytest.raises(amqtransport.errors.ReconnectExhausted):
        transport.start()
    transport.close()
    # pass 2's wait is cut by the probe (0.1 s), its attempt fails: pass 3 waits whole
    assert t.sleeps[:3] == [pytest.approx(0.1), 1.0, pytest.approx(0.1)]


def test_probe_interval_zero_turns_the_probe_off() -> None:
    backend = MemoryBackend()
    t = FakeTime()
    transport = _transport(backend, t, lambda leaf, _timeout: True, probeInterval=0)
    with pytest.raises(amqtransport.errors.ReconnectExhausted):
        transport.start()
    transport.close()
    assert t.sleeps and all(s == 1.0 for s in t.sleeps)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_real_broker_starting_late_is_reached_about_one_probe_after_it_listens(tmp_path) -> None:  # noqa: ANN001
    """A client waits for a broker that is not there yet with a 20 s back-off; the broker
    process starts: the client is connected long before the back-off would have ended."""
    port = _free_port()
    uri = f"failover:(tcp://127.0.0.1:{port})?initialReconnectDelay=20000&useExponentialBackOff=false"
    result: dict[str, object] = {}

    def connect() -> None:
        started = time.monotonic()
        try:
            conn = amqtransport.connect(uri)
        except BaseException as exc:  # noqa: BLE001 - reported below
            result["error"] = exc
            return
        result["seconds"] = time.monotonic() - started
        conn.close()

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    time.sleep(0.5)  # the first attempt failed: the client is in its 20 s wait
    with BrokerProcess(tmp_path, port=port):
        thread.join(15)
        assert "error" not in result, result
        assert "seconds" in result, "the client was still waiting for its back-off"


# -- the pending CONNECT (ConnectRace, open_probing) ------------------------------------------


def test_a_pending_connect_probes_only_the_endpoints_that_refused_in_this_reconnect() -> None:
    race: ConnectRace[str] = ConnectRace(enabled=True)
    assert race.targets("b", 1) == []
    race.failed("a", 1, refused=True, chosen=False)
    race.failed("c", 1, refused=False, chosen=False)  # timed out or failed its handshake: not probed
    race.failed("d", 1, refused=True, chosen=False)
    assert race.targets("b", 1) == ["a", "d"]
    assert race.targets("a", 1) == ["d"]  # never the endpoint being connected to
    race.failed("a", 2, refused=False, chosen=False)  # its last attempt no longer refused
    assert race.targets("b", 2) == ["d"]
    race.failed("a", 2, refused=True, chosen=False)
    assert race.targets("b", 2) == ["d", "a"]
    off: ConnectRace[str] = ConnectRace(enabled=False)  # probeInterval=0
    off.failed("a", 1, refused=True, chosen=False)
    assert off.targets("b", 1) == []


def test_after_a_probe_chosen_attempt_fails_no_pending_connect_is_cut_until_the_next_pass() -> None:
    race: ConnectRace[str] = ConnectRace(enabled=True)
    race.failed("a", 1, refused=True, chosen=False)
    race.failed("x", 1, refused=False, chosen=True)  # the attempt a probe chose failed its handshake
    assert race.targets("b", 1) == []
    assert race.targets("b", 2) == ["a"]


class FakeLink:
    """An open() that blocks until close() (a silent CONNECT), or returns at once."""

    def __init__(self, answers: bool = False) -> None:
        self.answers = answers
        self.closed = threading.Event()
        self.open_ended = threading.Event()

    def open(self) -> object:
        try:
            if not self.answers and self.closed.wait(30):
                raise amqtransport.errors.ConnectionClosed("closed while connecting")
            return "CONNECTED"
        finally:
            self.open_ended.set()

    def close(self, *, disconnect: bool = True) -> None:
        self.closed.set()


def test_open_probing_abandons_a_silent_open_for_the_first_target_that_accepts() -> None:
    link = FakeLink()
    probes: list[str] = []

    def probe(target: str, _timeout: float) -> bool:
        probes.append(target)
        return target == "b" and len(probes) >= 5  # b listens from the third round

    opened, won = open_probing(link, ["a", "b"], probe, every=0.01, timeout=30, clock=time.monotonic)
    assert (opened, won) == (None, "b")
    assert probes[:4] == ["a", "b", "a", "b"]
    assert link.closed.is_set() and link.open_ended.wait(10)


def test_open_probing_returns_the_link_that_opened_and_its_error_otherwise() -> None:
    link = FakeLink(answers=True)
    assert open_probing(link, ["a"], lambda _t, _s: False, every=0.01, timeout=30, clock=time.monotonic) == (link, None)
    assert not link.closed.is_set()
    failing = FakeLink()
    failing.close()  # its open fails at once
    with pytest.raises(amqtransport.errors.ConnectionClosed):
        open_probing(failing, ["a"], lambda _t, _s: False, every=0.01, timeout=30, clock=time.monotonic)
    stopped = FakeLink()
    with pytest.raises(amqtransport.errors.ConnectionClosed, match="closed while connecting"):
        open_probing(stopped, ["a"], lambda _t, _s: False, every=0.01, timeout=30, clock=time.monotonic,
                     stop=lambda: True)
    assert stopped.closed.is_set()


def test_a_connection_closed_before_any_answer_is_a_refusal_and_one_after_bytes_is_not() -> None:
    """What a proxy does when its upstream refuses (accept, then close with no answer)
    counts as a refusal (ConnectRefused), an end of stream or a reset alike; a broker
    that answered something and then closed failed its handshake (not raced)."""
    for reset in (None, "Connection reset by peer"):
        session = ClientSession(context="tcp://p:1: ")
        assert type(session.closed(reset)) is amqtransport.errors.ConnectRefused
        with pytest.raises(amqtransport.errors.ConnectRefused, match="before any answer to CONNECT"):
            session.feed(b"")
        session.feed(b"CONNECTED\n")  # part of an answer
        assert type(session.closed(reset)) is amqtransport.errors.ConnectError
        with pytest.raises(amqtransport.errors.ConnectError, match="during the STOMP handshake"):
            session.feed(b"")


def test_tcp_probe_does_not_count_a_port_that_accepts_and_closes_at_once() -> None:
    """A proxy whose upstream refuses accepts the probe and closes it: no broker there."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def close_each() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=close_each, name="test-close-each", daemon=True).start()
    try:
        assert not tcp_probe(LeafUri("tcp", "127.0.0.1", port), 1.0)
        assert not asyncio.run(async_tcp_probe(LeafUri("tcp", "127.0.0.1", port), 1.0))
    finally:
        server.close()
    with socket.create_server(("127.0.0.1", 0)) as listening:  # accepts and keeps it open
        leaf = LeafUri("tcp", "127.0.0.1", listening.getsockname()[1])
        assert tcp_probe(leaf, 1.0) and asyncio.run(async_tcp_probe(leaf, 1.0))


# -- an open abandoned from another thread at any moment (nemesis seed 2728, shared store) ------------------------------


def test_a_link_closed_while_its_open_starts_the_reader_thread_closes_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    """The failover's probe abandons a pending open from the supervisor thread while the
    open's thread runs: the close may land after the open made its reader thread and
    before it started it. That close raised (``cannot join thread before it is started``)
    and killed the supervisor: the client never reconnected. The close is landed there on
    purpose (a ``Thread.start`` that closes the link first, from a third thread)."""
    from amqtransport._backends.sockets import SocketBackend
    from amqtransport.broker import EmbeddedBroker
    from amqtransport.transports.link import ConnectParams, StompConnection

    with EmbeddedBroker(port=0) as broker:
        leaf = parse_uri(broker.uri)
        assert isinstance(leaf, LeafUri)
        link = StompConnection(leaf, backend=SocketBackend(), params=ConnectParams())
        errors: list[BaseException] = []
        real_start = threading.Thread.start

        def start(thread: threading.Thread) -> None:
            if thread.name.startswith("amq-reader"):
                def close() -> None:
                    try:
                        link.close(disconnect=False)
                    except BaseException as exc:  # noqa: BLE001 - what the test looks for
                        errors.append(exc)
                closer = threading.Thread(target=close)
                real_start(closer)
                closer.join(10)
            real_start(thread)

        monkeypatch.setattr(threading.Thread, "start", start)
        try:
            link.open()
        except amqtransport.errors.AmqTransportError:
            pass  # an open that sees the close fails: fine; a close that raises is not
        monkeypatch.undo()
        assert errors == []
        assert not link.alive
        assert link.wait_reader(5.0), "the reader started after the close must end"


def test_the_thread_supervisor_survives_an_unexpected_error_while_reconnecting() -> None:
    """A bug that raises inside a reconnect (anything but the transport's own errors) must
    not end the reconnecting for good (the supervisor thread died with it, and every
    request after waited for a link that never came): it is logged and the reconnect goes on."""
    from amqtransport._backends.sockets import SocketBackend
    from amqtransport.broker import EmbeddedBroker
    from amqtransport.stomp import Frame

    calls: list[str] = []

    class FlakyBackend(SocketBackend):
        def connect(self, leaf: LeafUri, timeout: float):  # type: ignore[no-untyped-def]  # noqa: ANN202
            calls.append(leaf_address(leaf))
            if len(calls) == 2:  # the first attempt of the reconnect
                raise RuntimeError("a bug in the reconnect path")
            return super().connect(leaf, timeout)

    first = EmbeddedBroker(port=0).start()
    port = first.port
    leaves = list(parse_uri(f"failover:(tcp://127.0.0.1:{port})").leaves())
    opts = FailoverOptions.model_validate({"initialReconnectDelay": 10, "maxReconnectDelay": 50,
                                           "timeout": 20000})
    transport = FailoverTransport(leaves, opts, backend=FlakyBackend())
    transport.start()
    second = None
    try:
        first.stop()
        second = EmbeddedBroker(port=port).start()
        receipt = transport.request(Frame.make("SEND", {"destination": "/queue/supervisor"}, b"x"))
        assert receipt is not None
        transport.wait(receipt, timeout=15)
        assert len(calls) >= 3 and transport.connected_address == f"tcp://127.0.0.1:{port}"
    finally:
        transport.close()
        if second is not None:
            second.stop()


def test_the_asyncio_supervisor_survives_an_unexpected_error_while_reconnecting() -> None:
    """The same rule in the asyncio driver: its supervisor task must not end for a bug."""
    from amqtransport.aio.failover import AsyncFailoverTransport
    from amqtransport.broker import EmbeddedBroker
    from amqtransport.stomp import Frame
    from amqtransport.transports.aio_link import open_stream_link

    calls: list[LeafUri] = []

    async def flaky_open(leaf: LeafUri, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]  # noqa: ANN202
        calls.append(leaf)
        if len(calls) == 2:  # the first attempt of the reconnect
            raise RuntimeError("a bug in the reconnect path")
        return await open_stream_link(leaf, *args, **kwargs)  # type: ignore[arg-type]

    first = EmbeddedBroker(port=0).start()
    port = first.port
    second: EmbeddedBroker | None = None

    async def scenario() -> None:
        nonlocal second
        leaves = list(parse_uri(f"failover:(tcp://127.0.0.1:{port})").leaves())
        opts = FailoverOptions.model_validate({"initialReconnectDelay": 10, "maxReconnectDelay": 50,
                                               "timeout": 20000})
        transport = AsyncFailoverTransport(leaves, opts, open_link=flaky_open)
        await transport.start()
        try:
            await asyncio.to_thread(first.stop)
            second = await asyncio.to_thread(EmbeddedBroker(port=port).start)
            receipt = await transport.request(Frame.make("SEND", {"destination": "/queue/supervisor"}, b"x"))
            assert receipt is not None
            await transport.wait(receipt, timeout=15)
            assert len(calls) >= 3
        finally:
            await transport.close()

    try:
        asyncio.run(scenario())
    finally:
        if second is not None:
            second.stop()
