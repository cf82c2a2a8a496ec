"""The combining writer (transports/coalesce.py).

Unit tests drive CoalescingWriter with a sink we control (blocking on an event,
failing on demand); the rest run over real sockets: a StompConnection against a tiny
STOMP peer that stops reading, and the client against the embedded broker."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import amqtransport
from amqtransport.broker import EmbeddedBroker
from amqtransport.errors import ConnectionClosed, WriteError
from amqtransport.testing.wait import wait_for
from amqtransport.transports.coalesce import CoalescingWriter
from amqtransport.transports.link import ConnectParams, StompConnection
from amqtransport.uri import LeafUri, parse_uri

pytestmark = pytest.mark.timeout(60)


# -- CoalescingWriter with a controlled sink ---------------------------------------------


class Sink:
    """Records every call; can hold a call until released and fail chosen calls."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.fail_calls: set[int] = set()
        self.delay = 0.0

    def __call__(self, data: bytes) -> None:
        index = len(self.calls)
        self.calls.append(data)
        self.entered.set()
        self.hold.wait(10)
        if self.delay:
            time.sleep(self.delay)
        if index in self.fail_calls:
            raise WriteError(f"sink call {index} failed")


def _start(target: Any, *args: Any) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            target(*args)
            result["ok"] = True
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            result["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def _wait_until(cond: Any, timeout: float = 5.0) -> None:
    wait_for(cond, timeout, interval=0.002)


def test_order_kept_and_writes_coalesced_under_many_threads() -> None:
    sink = Sink()
    sink.delay = 0.0005  # a slow socket: later callers queue behind the flush in flight
    writer = CoalescingWriter(sink)
    threads, per_thread = 12, 150

    def produce(t: int) -> None:
        for i in range(per_thread):
            writer.write(f"<{t}:{i}>".encode())

    workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    wire = b"".join(sink.calls).decode()
    chunks = wire.strip("<>").split("><")
    assert len(chunks) == threads * per_thread  # nothing lost, nothing torn
    seen: dict[int, int] = {}
    for chunk in chunks:
        t, i = (int(x) for x in chunk.split(":"))
        assert i == seen.get(t, -1) + 1, f"thread {t}: {i} after {seen.get(t)}"
        seen[t] = i
    assert writer.writes == threads * per_thread
    assert writer.flushes == len(sink.calls) < writer.writes  # several frames per sendall


def test_waiting_callers_return_after_the_flush_that_carried_them() -> None:
    sink = Sink()
    writer = CoalescingWriter(sink)
    sink.hold.clear()
    a, ra = _start(writer.write, b"A")
    assert sink.entered.wait(5)
    b, rb = _start(writer.write, b"B")
    c, rc = _start(writer.write, b"C")
    _wait_until(lambda: writer.writes == 3)
    time.sleep(0.05)
    assert not rb and not rc, "B and C returned before their bytes were written"
    sink.hold.set()
    for t in (a, b, c):
        t.join(5)
    assert ra == rb == rc == {"ok": True}
    assert sink.calls[0] == b"A"
    assert b"".join(sink.calls[1:]) in (b"BC", b"CB") and len(sink.calls) == 2  # B and C in one write


def test_error_reaches_the_callers_whose_bytes_failed_and_only_them() -> None:
    sink = Sink()
    writer = CoalescingWriter(sink)
    sink.fail_calls = {1}  # A's flush works, the next one (B, C) fails
    sink.hold.clear()
    a, ra = _start(writer.write, b"A")
    assert sink.entered.wait(5)
    b, rb = _start(writer.write, b"B")
    c, rc = _start(writer.write, b"C")
    _wait_until(lambda: writer.writes == 3)
    sink.hold.set()
    for t in (a, b, c):
        t.join(5)
    assert ra == {"ok": True}, "A's bytes were written: A must not see B's error"
    assert isinstance(rb.get("error"), WriteError) and isinstance(rc.get("error"), WriteError)
    assert writer.broken is rb["error"]
    with pytest.raises(WriteError):  # nothing may follow bytes that did not go out
        writer.write(b"D")
    assert b"D" not in b"".join(sink.calls)


def test_flusher_own_failure_raises_to_it() -> None:
    sink = Sink()
    sink.fail_calls = {0}
    writer = CoalescingWriter(sink)
    with pytest.raises(WriteError):
        writer.write(b"A")


def test_a_bug_in_the_sink_is_reported_in_the_transport_error_family() -> None:
    def sink(data: bytes) -> None:
        raise ValueError("boom")

    writer = CoalescingWriter(sink)
    with pytest.raises(WriteError, match="boom") as info:
        writer.write(b"A")
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(WriteError):
        writer.write(b"B")


def test_fire_and_forget_does_not_wait_for_a_flush_in_flight() -> None:
    sink = Sink()
    writer = CoalescingWriter(sink)
    sink.hold.clear()
    a, ra = _start(writer.write, b"BIG")
    assert sink.entered.wait(5)
    t0 = time.monotonic()
    writer.write(b"\n", wait=False)  # a heart-beat: queued behind the big write
    assert time.monotonic() - t0 < 1.0
    assert sink.calls == [b"BIG"]
    sink.hold.set()
    a.join(5)
    assert ra == {"ok": True}
    assert sink.calls == [b"BIG", b"\n"]  # the flusher took it after its own bytes


# -- StompConnection: heart-beats while a big send is stuck in the socket -------------------


class SlowPeer:
    """A STOMP 'broker' that answers CONNECTED (asking for heart-beats every 100 ms)
    and then reads only when told to, recording what it gets."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.reading = threading.Event()
        self.received = bytearray()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        sock, _ = self.listener.accept()
        with sock:
            sock.settimeout(0.05)
            buf = b""
            while b"\x00" not in buf:
                buf += sock.recv(65536)
            sock.sendall(b"CONNECTED\nversion:1.2\nheart-beat:0,100\n\n\x00")
            while not self.stop.is_set():
                if not self.reading.is_set():
                    time.sleep(0.01)
                    continue
                try:
                    data = sock.recv(1 << 20)
                except TimeoutError:
                    continue
                if not data:
                    return
                self.received += data

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.listener.close()


@pytest.fixture
def slow_peer() -> Iterator[SlowPeer]:
    peer = SlowPeer()
    try:
        yield peer
    finally:
        peer.close()


def test_heartbeats_are_queued_while_a_big_send_is_stuck_and_follow_it(slow_peer: SlowPeer) -> None:
    from amqtransport._backends.sockets import SocketBackend
    from amqtransport.stomp import Frame

    leaf = parse_uri(f"tcp://127.0.0.1:{slow_peer.port}")
    assert isinstance(leaf, LeafUri)
    conn = StompConnection(leaf, backend=SocketBackend(), params=ConnectParams(heartbeat=(100, 0)))
    conn.open()
    try:
        assert conn.send_every_ms == 100 and conn.writer is not None
        body = b"x" * (32 << 20)  # far more than the socket buffers hold: sendall blocks
        big, result = _start(conn.write, Frame.make("SEND", {"destination": "/queue/big"}, body))
        time.sleep(0.3)
        assert big.is_alive(), "the big send should still be stuck (the peer is not reading)"
        beats_before = conn.writer.writes
        time.sleep(0.5)
        # the heart-beat thread kept running: it queued beats behind the stuck write
        assert conn.writer.writes > beats_before
        slow_peer.reading.set()
        big.join(30)
        assert result == {"ok": True}
        _wait_until(lambda: len(slow_peer.received) > len(body) + 50 and slow_peer.received.endswith(b"\n"))
        time.sleep(0.35)  # idle now: beats keep coming on their own
        wire = bytes(slow_peer.received)
        end = wire.index(b"\x00")
        assert wire[end - 3:end] == b"xxx"  # the big frame arrived whole ...
        tail = wire[end + 1:]
        assert tail and set(tail) == {ord("\n")}  # ... followed by heart-beats only
        assert len(tail) >= 3
    finally:
        conn.close(disconnect=False)


# -- the client over the combining writer, against the embedded broker ---------------------------------------------


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=0) as b:
        yield b


def test_writes_after_the_link_died_raise_a_transport_error(broker: EmbeddedBroker) -> None:
    conn = amqtransport.connect(broker.uri, heartbeat=(0, 0))
    link = conn.transport.link  # type: ignore[attr-defined]
    link.kill(ConnectionClosed("test: link killed"))
    from amqtransport.errors import TransportError

    with pytest.raises(TransportError):
        conn.send("/queue/x", "after")
    conn.close()


def test_concurrent_producers_on_one_connection_keep_each_threads_order(broker: EmbeddedBroker) -> None:
    dest = "/queue/coalesce.order"
    threads, per_thread = 8, 100
    with amqtransport.connect(broker.uri, heartbeat=(0, 0)) as conn:
        def produce(t: int) -> None:
            with conn.producer(window=20) as p:
                for i in range(per_thread):
                    p.send(dest, f"{t}:{i}")

        workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(30)
        writer = conn.transport.link.writer  # type: ignore[attr-defined]
        assert writer.writes >= threads * per_thread
        sub = conn.subscribe(dest, ack="client-individual")
        seen: dict[int, int] = {}
        for _ in range(threads * per_thread):
            m = sub.receive(5)
            assert m is not None
            t, i = (int(x) for x in m.text.split(":"))
            assert i == seen.get(t, -1) + 1, f"thread {t}: {i} after {seen.get(t)}"
            seen[t] = i
            m.ack()
        assert seen == {t: per_thread - 1 for t in range(threads)}


def test_request_many_writes_a_window_in_one_system_call(broker: EmbeddedBroker) -> None:
    from amqtransport.stomp import Frame

    conn = amqtransport.connect(f"failover:({broker.uri})", heartbeat=(0, 0))
    try:
        transport = conn.transport
        writer = transport.link.writer  # type: ignore[union-attr]
        before = writer.flushes
        frames = [Frame.make("SEND", {"destination": "/queue/many", "persistent": "true"}, f"m-{i}".encode())
                  for i in range(50)]
        receipts = transport.request_many(frames)  # type: ignore[attr-defined]
        assert writer.flushes == before + 1
        assert [transport.wait(rec, timeout=10).command for rec in receipts] == ["RECEIPT"] * 50
        sub = conn.subscribe("/queue/many")
        got = [sub.receive(timeout=5) for _ in range(50)]
        assert [m.text for m in got if m is not None] == [f"m-{i}" for i in range(50)]
    finally:
        conn.close()
