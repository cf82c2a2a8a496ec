"""A scripted in-memory backend: fake STOMP endpoints for unit tests of the failover layer.

Theory of operation
-------------------
:class:`MemoryBackend` maps ``host:port`` to a :class:`ScriptedBroker`. Connecting
to an endpoint that is missing or ``down`` raises ``ConnectError`` (and is logged
in :attr:`MemoryBackend.connect_log`, so tests can assert the exact order of
attempts). A connection is a :class:`MemoryStream`: what the client writes is parsed
*synchronously, in the writer's thread* by the scripted broker, which appends its
answers (CONNECTED, RECEIPT, MESSAGE...) to the stream's inbound buffer; the
client's reader thread picks them up from there. No thread of its own, so tests are
deterministic.

The scripted broker is deliberately dumb: it answers CONNECT with CONNECTED, every
frame carrying ``receipt`` with a RECEIPT (unless ``hold_receipts``), records every
frame it received (per connection and in total), and lets the test ``drop()`` live
connections (the client sees end of stream), ``stall()`` them (half-open: nothing is
answered or delivered any more), end the next ones right after CONNECTED
(``dead_on_arrival``), and ``deliver()`` MESSAGE frames.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from amqtransport.errors import ConnectError, ConnectionClosed
from amqtransport.stomp import NEED_DATA, Frame, FrameParser, Heartbeat, serialize

__all__ = ["MemoryBackend", "ScriptedBroker", "MemoryStream"]


class MemoryStream:
    """Client end of an in-memory connection to a :class:`ScriptedBroker`."""

    def __init__(self, broker: ScriptedBroker, peer: str) -> None:
        self._broker = broker
        self._peer = peer
        self._cond = threading.Condition()
        self._inbound = bytearray()
        self._eof = False
        self._closed = False
        self.stalled = False
        self.parser = FrameParser()
        self.frames: list[Frame] = []  # frames the broker received on this connection
        self.version = "1.2"

    @property
    def peer(self) -> str:
        return self._peer

    # client side -----------------------------------------------------------
    def read(self, max_bytes: int, timeout: float | None) -> bytes | None:
        with self._cond:
            if not self._inbound and not self._eof and not self._closed:
                self._cond.wait(timeout)
            if self._closed:
                raise ConnectionClosed(f"{self._peer}: stream closed")
            if self._inbound:
                data = bytes(self._inbound[:max_bytes])
                del self._inbound[:max_bytes]
                return data
            if self._eof:
                return b""
            return None

    def write(self, data: bytes) -> None:
        with self._cond:
            if self._closed:
                raise ConnectionClosed(f"{self._peer}: stream closed")
            if self._eof:
                from amqtransport.errors import WriteError

                raise WriteError(f"{self._peer}: broken pipe")
        if self.stalled:
            return
        self._broker._on_bytes(self, data)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._broker._forget(self)

    # broker side -------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return not (self._closed or self._eof)

    def push(self, data: bytes) -> None:
        with self._cond:
            if self._closed or self._eof or self.stalled:
                return
            self._inbound += data
            self._cond.notify_all()

    def push_frame(self, frame: Frame) -> None:
        self.push(serialize(frame, self.version))

    def hang_up(self) -> None:
        with self._cond:
            self._eof = True
            self._cond.notify_all()


class ScriptedBroker:
    """One fake endpoint. Attributes are meant to be set by tests."""

    def __init__(self, address: str, *, heart_beat: str = "0,0") -> None:
        self.address = address
        self.up = True
        self.heart_beat = heart_beat
        self.hold_receipts = False
        self.auth_fail = False
        #: this many next connections get CONNECTED and, with it, the end of the stream (a
        #: master killed while its answer was still on its way)
        self.dead_on_arrival = 0
        #: the CONNECTED frame's ``server`` header (the client detects its dialect from it)
        self.server = "scripted"
        self.received: list[Frame] = []
        self.connections: list[MemoryStream] = []
        self.connect_count = 0
        #: Optional hook: called with (stream, frame) before the default answer;
        #: return True to suppress the default answer.
        self.on_frame: Callable[[MemoryStream, Frame], bool] | None = None
        self._lock = threading.Lock()
        self._msg_seq = 0

    # test controls -------------------------------------------------------------
    @property
    def live(self) -> list[MemoryStream]:
        with self._lock:
            return [c for c in self.connections if c.alive]

    def drop(self) -> None:
        """End every live connection (the client sees end of stream)."""
        for conn in self.live:
            conn.hang_up()

    def stall(self) -> None:
        """Half-open: live connections stop answering and delivering, without closing."""
        for conn in self.live:
            conn.stalled = True

    def deliver(self, destination: str, body: bytes | str, headers: dict[str, str] | None = None,
                *, subscription: str | None = None) -> Frame:
        """Send a MESSAGE on the newest live connection with a matching subscription."""
        for conn in reversed(self.live):
            subs = {f.get("id"): f for f in conn.frames if f.command == "SUBSCRIBE"}
            for f in conn.frames:
                if f.command == "UNSUBSCRIBE":
                    subs.pop(f.get("id"), None)
            sub_id = subscription
            if sub_id is None:
                sub_id = next((i for i, f in subs.items() if f.get("destination") == destination), None)
            if sub_id is None or sub_id not in subs:
                continue
            with self._lock:
                self._msg_seq += 1
                mid = f"{self.address}-m{self._msg_seq}"
            frame = Frame.make("MESSAGE", {"destination": destination, "subscription": sub_id,
                                           "message-id": mid, "ack": mid, **(headers or {})}, body)
            conn.push_frame(frame)
            return frame
        raise AssertionError(f"{self.address}: no live subscription for {destination}")

    def frames(self, command: str) -> list[Frame]:
        return [f for f in self.received if f.command == command]

    # driven by MemoryStream ----------------------------------------------------
    def _attach(self, stream: MemoryStream) -> None:
        with self._lock:
            self.connections.append(stream)
            self.connect_count += 1

    def _forget(self, stream: MemoryStream) -> None:
        stream.hang_up()

    def _on_bytes(self, stream: MemoryStream, data: bytes) -> None:
        stream.parser.feed(data)
        while True:
            event = stream.parser.next_event()
            if event is NEED_DATA:
                return
            if isinstance(event, Heartbeat):
                continue
            assert isinstance(event, Frame)
            self._on_frame(stream, event)

    def _on_frame(self, stream: MemoryStream, frame: Frame) -> None:
        with self._lock:
            self.received.append(frame)
            stream.frames.append(frame)
        if self.on_frame is not None and self.on_frame(stream, frame):
            return
        if frame.command in ("CONNECT", "STOMP"):
            if self.auth_fail:
                stream.push_frame(Frame.make("ERROR", {"message": "Authentication failed: bad login"}))
                stream.hang_up()
                return
            stream.push(serialize(Frame.make("CONNECTED", {"version": "1.2", "heart-beat": self.heart_beat,
                                                             "server": self.server}), "1.2"))
            with self._lock:
                dies, self.dead_on_arrival = self.dead_on_arrival > 0, max(0, self.dead_on_arrival - 1)
            if dies:
                stream.hang_up()
            return
        if frame.command == "DISCONNECT":
            receipt = frame.get("receipt")
            if receipt is not None:
                stream.push_frame(Frame.make("RECEIPT", {"receipt-id": receipt}))
            stream.hang_up()
            return
        receipt = frame.get("receipt")
        if receipt is not None and not self.hold_receipts:
            stream.push_frame(Frame.make("RECEIPT", {"receipt-id": receipt}))


class MemoryBackend:
    """A registry of scripted endpoints keyed by ``host:port``."""

    def __init__(self) -> None:
        self.brokers: dict[str, ScriptedBroker] = {}
        self.connect_log: list[str] = []
        self._lock = threading.Lock()

    def add(self, address: str, **kwargs: Any) -> ScriptedBroker:
        """Register endpoint ``host:port`` (also accepts ``tcp://host:port``)."""
        key = address.split("://", 1)[-1]
        broker = ScriptedBroker(key, **kwargs)
        self.brokers[key] = broker
        return broker

    def connect(self, leaf: Any, timeout: float) -> MemoryStream:
        key = f"{leaf.host}:{leaf.port}"
        with self._lock:
            self.connect_log.append(key)
        broker = self.brokers.get(key)
        if broker is None or not broker.up:
            raise ConnectError(f"tcp://{key}: connection refused (scripted)")
        stream = MemoryStream(broker, f"tcp://{key}")
        broker._attach(stream)
        return stream
