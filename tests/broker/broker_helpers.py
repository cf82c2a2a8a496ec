"""Test clients for the broker: stomp.py (an independent peer) and a raw socket."""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import stomp

from amqtransport.errors import RemoteProtocolError
from amqtransport.stomp import Frame, FrameParser, Heartbeat, serialize

TIMEOUT = 10.0


class MessageSink:
    """A connection as the broker core sees it (unit tests of BrokerCore): every message
    delivered to it, in order."""

    writable = True

    def __init__(self) -> None:
        self.got: list[Any] = []  # the Messages

    def deliver(self, sub: object, message: Any, delivery_count: int) -> None:
        self.got.append(message)


def tear_last_record(seg: Path, n: int) -> None:
    """What a crash does to the last record of segment ``seg``: its last ``n`` bytes never
    landed. A killed broker's head is preallocated (zeros after the written data,
    ``store/segments.py``): the bytes become zeros; a segment that grew as written is cut."""
    raw = seg.read_bytes()
    end = len(raw.rstrip(b"\0"))  # the written data
    with open(seg, "r+b") as fh:
        fh.seek(end - n)
        fh.write(bytes(n))
        if end == len(raw):
            fh.truncate(end - n)


def drain(port: int, queue: str) -> list[int]:
    """Every message of ``queue`` a consumer gets (acked one by one) until 2 s pass with
    none: their ``seq`` headers, in order of arrival."""
    c = StompPy(port)
    c.conn.subscribe(queue, id="1", ack="client-individual", headers={"activemq.prefetchSize": "500"})
    got: list[int] = []
    try:
        while True:
            m = c.get(timeout=2.0)
            got.append(int(m.headers["seq"]))
            c.conn.ack(m.headers["ack"])
    except AssertionError:
        pass
    c.close()
    return got


class Received:
    """A MESSAGE/ERROR/RECEIPT seen by a stomp.py listener."""

    def __init__(self, frame: Any) -> None:
        self.headers: dict[str, str] = dict(frame.headers)
        body = frame.body
        self.body: str = body.decode() if isinstance(body, bytes) else body

    def __repr__(self) -> str:
        return f"<Received {self.headers} {self.body!r}>"


class _Listener(stomp.ConnectionListener):  # type: ignore[misc]
    def __init__(self, owner: StompPy) -> None:
        self.owner = owner

    def on_message(self, frame: Any) -> None:
        self.owner.messages.put(Received(frame))

    def on_error(self, frame: Any) -> None:
        self.owner.errors.put(Received(frame))

    def on_receipt(self, frame: Any) -> None:
        with self.owner.cond:
            self.owner.receipts.add(frame.headers["receipt-id"])
            self.owner.cond.notify_all()

    def on_disconnected(self) -> None:
        with self.owner.cond:
            self.owner.disconnected = True
            self.owner.cond.notify_all()


class StompPy:
    """stomp.py connection with queues of what arrived."""

    def __init__(
        self,
        port: int,
        *,
        version: str = "1.2",
        heartbeats: tuple[int, int] = (0, 0),
        login: str | None = None,
        passcode: str | None = None,
        client_id: str | None = None,
        wait: bool = True,
    ) -> None:
        cls = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}[
            version
        ]
        kwargs: dict[str, Any] = {"heartbeats": heartbeats} if version != "1.0" else {}
        self.conn = cls([("127.0.0.1", port)], **kwargs)
        self.messages: queue.Queue[Received] = queue.Queue()
        self.errors: queue.Queue[Received] = queue.Queue()
        self.receipts: set[str] = set()
        self.cond = threading.Condition()
        self.disconnected = False
        self.conn.set_listener("t", _Listener(self))
        headers = {"client-id": client_id} if client_id else {}
        self.conn.connect(login, passcode, wait=wait, headers=headers)
        self._n = 0

    def receipt_id(self) -> str:
        self._n += 1
        return f"r-{id(self)}-{self._n}"

    def send(
        self, dest: str, body: str, *, receipt: bool = True, persistent: bool = True, **headers: str
    ) -> str | None:
        rid = self.receipt_id() if receipt else None
        hdrs = {"persistent": "true" if persistent else "false", **headers}
        if rid is not None:
            self.conn.send(dest, body, headers=hdrs, receipt=rid)
        else:
            self.conn.send(dest, body, headers=hdrs)
        return rid

    def wait_receipts(
        self, ids: set[str | None] | list[str | None], timeout: float = TIMEOUT
    ) -> None:
        wanted = {i for i in ids if i is not None}
        with self.cond:
            ok = self.cond.wait_for(lambda: wanted <= self.receipts, timeout)
        assert ok, (
            f"missing receipts: {sorted(wanted - self.receipts)[:5]} (errors: {self.drain_errors()})"
        )

    def drain_errors(self) -> list[Received]:
        out = []
        while True:
            try:
                out.append(self.errors.get_nowait())
            except queue.Empty:
                return out

    def get(self, timeout: float = TIMEOUT) -> Received:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"no message within {timeout} s (errors: {self.drain_errors()})"
            ) from None

    def get_n(self, n: int, timeout: float = TIMEOUT) -> list[Received]:
        deadline = time.monotonic() + timeout
        return [self.get(max(0.01, deadline - time.monotonic())) for _ in range(n)]

    def none(self, timeout: float = 0.3) -> None:
        try:
            extra = self.messages.get(timeout=timeout)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected message {extra}")

    def wait_disconnected(self, timeout: float = TIMEOUT) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.disconnected, timeout)

    def close(self) -> None:
        try:
            if self.conn.is_connected():
                self.conn.disconnect()
        except Exception:  # noqa: BLE001 - closing after a broker-side close
            pass


class Raw:
    """A raw socket speaking frames through our codec (frame-level checks)."""

    def __init__(self, port: int, version: str = "1.2") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        self.version = version
        self.parser = FrameParser(version)
        self.heartbeats = 0

    def send(self, frame: Frame) -> None:
        self.sock.sendall(serialize(frame, self.version))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def connect(self, headers: Mapping[str, str] | None = None) -> Frame:
        hdrs = {"accept-version": "1.2", "host": "localhost", **(headers or {})}
        self.send(Frame.make("CONNECT", hdrs))
        return self.read()

    def read(self, timeout: float = TIMEOUT) -> Frame:
        """The next frame (heart-beats are counted and skipped); AssertionError on EOF."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.parser.events():
                if isinstance(event, Heartbeat):
                    self.heartbeats += 1
                    continue
                assert isinstance(event, Frame)
                return event
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("no frame within timeout")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise AssertionError("no frame within timeout") from None
            if not data:
                raise AssertionError("connection closed by the broker")
            self.parser.feed(data)

    def closed(self, timeout: float = TIMEOUT) -> bool:
        """True when the broker closes the socket within ``timeout`` (frames are drained)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return False
            except ConnectionResetError:
                return True
            if not data:
                return True
            try:
                self.parser.feed(data)
                for event in self.parser.events():
                    if isinstance(event, Heartbeat):
                        self.heartbeats += 1
            except RemoteProtocolError:
                pass
        return False

    def close(self) -> None:
        self.sock.close()
