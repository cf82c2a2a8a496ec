"""Helpers for the HA tests: traffic through a failover URI across a kill, a TCP forwarder."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import amqtransport
from amqtransport.broker.ha.wire import PING, SYNC_END, pack
from amqtransport.stomp import IDEMPOTENCY_HEADER
from amqtransport.testing.broker_pair import BrokerPair
from amqtransport.testing.ports import free_port
from amqtransport.testing.wait import wait_for as _wait_for

_HEADER = struct.Struct("!BI")  # a replication frame: u8 kind | u32 length (wire.py)


def with_opts(uri: str, extra: str) -> str:
    return uri + ("&" if "?" in uri else "?") + extra


@dataclass
class TrafficResult:
    receipted: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    consumed: Counter[str] = field(default_factory=Counter)
    recovery: list[float] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def check_exactly_once(self) -> None:
        missing = [b for b in self.receipted if self.consumed[b] == 0]
        dups = {b: n for b, n in self.consumed.items() if n > 1}
        assert not missing, f"{len(missing)} receipted messages lost, e.g. {missing[:5]}"
        assert not dups, f"duplicates delivered despite dedupe: {list(dups.items())[:5]}"
        attempted = set(self.receipted) | set(self.failed)
        strange = [b for b in self.consumed if b not in attempted]
        assert not strange, f"consumed messages nobody sent: {strange[:5]}"


def run_traffic(
    uri: str,
    kills: list[Callable[[], None]],
    *,
    total: int = 400,
    kill_every: int = 120,
    queue: str = "/queue/ha.test",
    drain_timeout: float = 30.0,
) -> TrafficResult:
    """Produce ``total`` receipted messages while a consumer reads; run ``kills[i]`` after
    every ``kill_every`` receipts and measure kill -> next receipted send."""
    res = TrafficResult()
    done_producing = threading.Event()
    uri = with_opts(uri, "trackMessages=true&initialReconnectDelay=10&maxReconnectDelay=200")

    def consume() -> None:
        try:
            with amqtransport.connect(uri, dedupe=True) as c:
                sub = c.subscribe(queue, ack="client-individual")
                deadline = None
                while True:
                    m = sub.receive(timeout=0.5)
                    if m is not None:
                        res.consumed[m.text] += 1
                        m.ack()
                    if done_producing.is_set():
                        if all(res.consumed[b] for b in res.receipted):
                            # a little longer to catch a late duplicate
                            if deadline is None:
                                deadline = time.monotonic() + 1.0
                        if deadline is None:
                            deadline = time.monotonic() + drain_timeout
                        if time.monotonic() > deadline:
                            return
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            res.errors.append(exc)

    consumer = threading.Thread(target=consume, name="ha-consumer", daemon=True)
    consumer.start()
    pending_kills = list(kills)
    try:
        with amqtransport.connect(uri) as c:
            killed_at: float | None = None
            for i in range(total):
                body = f"m{i:05d}"
                try:
                    c.send(queue, body, idempotency_key=f"key-{queue}-{body}")
                except Exception:  # noqa: BLE001 - an unconfirmed send is allowed, not required
                    res.failed.append(body)
                    continue
                res.receipted.append(body)
                if killed_at is not None:
                    res.recovery.append(time.monotonic() - killed_at)
                    killed_at = None
                if pending_kills and len(res.receipted) % kill_every == 0:
                    kill = pending_kills.pop(0)
                    kill()
                    killed_at = time.monotonic()
    finally:
        done_producing.set()
        consumer.join(drain_timeout + 10)
    return res


class Forwarder:
    """A TCP forwarder we control: ``cut()`` drops every connection and refuses service
    (accept + close at once) until ``restore()``; ``freeze()`` makes the connections open
    now silent in both directions and half-open (an EOF on one side is not passed on),
    while new connections are forwarded as usual; ``trap_sync_end()`` freezes the next
    replication link right after the master's ``SYNC_END``, keeping the slave's end alive."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._srv = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        self._srv.settimeout(0.2)
        self._cut = False
        self._socks: list[socket.socket] = []
        self._frozen: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = False
        self._trap = False
        #: set once :meth:`trap_sync_end` froze a link
        self.trapped = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="forwarder")
        self._thread.start()

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._srv.accept()
            except (TimeoutError, OSError):
                continue
            if self._cut:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, _SyncEndWatch()), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, watch: _SyncEndWatch | None = None) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or self._cut:
                    break
                if src in self._frozen:
                    continue  # swallowed
                end = watch.feed(data) if watch is not None else None
                if end is not None and self._trap:
                    self._spring(src, dst, data[:end])
                    continue
                dst.sendall(data)
        except OSError:
            pass
        if src in self._frozen and not self._cut:
            return  # half-open: the other side never hears of it
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self._cut = True
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def freeze(self) -> None:
        with self._lock:
            self._frozen.update(self._socks)

    def trap_sync_end(self) -> None:
        """Freeze the next replication link the moment the master's ``SYNC_END`` has gone
        through to the slave: from then on nothing the slave writes reaches the master
        (its ack of ``SYNC_END`` first) and nothing more of the master's reaches the slave,
        which hears a ``PING`` every 0.25 s instead, so its link stays up until :meth:`cut`
        (the master hears silence and drops the link; an EOF from it is not passed on)."""
        self._trap = True

    def _spring(self, upstream: socket.socket, client: socket.socket, head: bytes) -> None:
        with self._lock:
            self._trap = False
            self._frozen.update((client, upstream))  # the slave's ack is swallowed from now on
        client.sendall(head)  # up to and including SYNC_END, whole frames only
        self.trapped.set()

        def keep_alive() -> None:
            with contextlib.suppress(OSError):
                while not self._cut and not self._stop:
                    client.sendall(pack(PING))
                    time.sleep(0.25)

        threading.Thread(target=keep_alive, daemon=True, name="forwarder-pings").start()

    def restore(self) -> None:
        self._cut = False

    def close(self) -> None:
        self._stop = True
        self.cut()
        self._srv.close()
        self._thread.join(2)


class _SyncEndWatch:
    """Follows the master's side of one connection (a STOMP ``CONNECTED`` frame, then the
    binary replication frames, :mod:`amqtransport.broker.ha.wire`): :meth:`feed` returns
    the offset in ``data`` just past the first ``SYNC_END`` frame, or None."""

    def __init__(self) -> None:
        self._in_stomp = True
        self._skip_eols = False
        self._header = b""
        self._left = 0  # payload bytes of the current frame still to come
        self._kind = 0
        self._done = False

    def feed(self, data: bytes) -> int | None:
        i, n = 0, len(data)
        while i < n and not self._done:
            if self._in_stomp:
                nul = data.find(b"\x00", i)
                if nul < 0:
                    return None
                self._in_stomp, self._skip_eols, i = False, True, nul + 1
            elif self._skip_eols and data[i] in b"\r\n":
                i += 1
            elif self._left:
                take = min(self._left, n - i)
                self._left -= take
                i += take
                if not self._left and self._kind == SYNC_END:
                    self._done = True
                    return i
            else:
                self._skip_eols = False
                need = _HEADER.size - len(self._header)
                self._header += data[i : i + need]
                i += min(need, n - i)
                if len(self._header) == _HEADER.size:
                    self._kind, self._left = _HEADER.unpack(self._header)
                    self._header = b""
                    if not self._left and self._kind == SYNC_END:
                        self._done = True
                        return i
        return None


@contextlib.contextmanager
def frozen(node: Any) -> Iterator[None]:
    """SIGSTOP the process of ``node`` (an HaNodeProcess) for the ``with`` body; SIGCONT
    on the way out, whatever happens."""
    os.kill(node.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(node.pid, signal.SIGCONT)


def send_in_background(conn: Any, queue: str, body: str) -> threading.Event:
    """Start ``conn.send(queue, body)`` (which waits for its receipt) on a daemon thread;
    the event is set once it returned."""
    done = threading.Event()
    threading.Thread(target=lambda: (conn.send(queue, body), done.set()), daemon=True).start()
    return done


@contextlib.contextmanager
def forwarded_pair(data_dir: Path, **kwargs: Any) -> Iterator[tuple[BrokerPair, Forwarder]]:
    """A replicated :class:`BrokerPair` (not started yet) whose slave reaches the master's
    HA port through a :class:`Forwarder` (``cut()`` / ``freeze()`` it); both are stopped
    on exit. ``kwargs`` go to BrokerPair."""
    master_ha = free_port()
    fwd = Forwarder(("127.0.0.1", master_ha))
    bp = BrokerPair("replicated", data_dir, master_connector=fwd.address, **kwargs)
    bp.a.ha_port = master_ha
    try:
        yield bp, fwd
    finally:
        bp.stop()
        fwd.close()


class Listener:
    """A bare TCP listener (the takeover-check address); close() makes it unreachable."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._srv: socket.socket | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def open(self) -> Listener:
        if self._srv is None:
            self._srv = socket.create_server(("127.0.0.1", self.port))
        return self

    def close(self) -> None:
        if self._srv is not None:
            self._srv.close()
            self._srv = None


def refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


def never_master(node: object, seconds: float) -> None:
    """Assert that ``node`` (HaNodeProcess) does not become master for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        role = node.status(timeout=1.0).get("amq-ha-role")  # type: ignore[attr-defined]
        assert role != "master", f"{node.name} became master"  # type: ignore[attr-defined]
        assert refuses(node.port), f"{node.name}'s client port accepts connections"  # type: ignore[attr-defined]
        time.sleep(0.1)


def wait_for(pred: Callable[[], object], timeout: float, what: str) -> None:
    """:func:`amqtransport.testing.wait.wait_for` every 50 ms (a probe asks both nodes)."""
    _wait_for(pred, timeout, what, interval=0.05)


def read_frames(sock: socket.socket, until: float) -> tuple[list[bytes], bool]:
    """Frames (raw bytes up to each NUL, EOLs stripped) read until EOF or ``until``;
    and whether the peer closed the connection."""
    buf = b""
    closed = False
    while time.monotonic() < until:
        sock.settimeout(max(0.05, until - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except OSError:
            closed = True
            break
        if not chunk:
            closed = True
            break
        buf += chunk
    frames = [f.lstrip(b"\r\n") for f in buf.split(b"\x00")]
    return [f for f in frames if f], closed


def raw_connect(port: int, client_id: str | None = None) -> socket.socket:
    """A raw STOMP 1.2 connection (no heart-beats), CONNECTED; ``client_id`` for durable subscriptions."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    extra = f"client-id:{client_id}\n" if client_id else ""
    sock.sendall(f"CONNECT\naccept-version:1.2\nhost:x\nheart-beat:0,0\n{extra}\n\x00".encode())
    data = b""
    while b"\x00" not in data:
        chunk = sock.recv(4096)
        assert chunk, "the broker closed the connection instead of answering CONNECT"
        data += chunk
    assert data.startswith(b"CONNECTED"), data
    return sock


def raw_send(sock: socket.socket, destination: str, body: str, *, receipt: str | None = None,
             idempotency_key: str | None = None) -> None:
    """A persistent SEND of ``body`` on a raw connection (:func:`raw_connect`), asking for a
    RECEIPT with id ``receipt`` and carrying ``idempotency_key`` when given; no wait."""
    data = body.encode()
    headers = f"destination:{destination}\n"
    if receipt is not None:
        headers += f"receipt:{receipt}\n"
    headers += "persistent:true\n"
    if idempotency_key is not None:
        headers += f"{IDEMPOTENCY_HEADER}:{idempotency_key}\n"
    sock.sendall(f"SEND\n{headers}content-length:{len(data)}\n\n".encode() + data + b"\x00")
