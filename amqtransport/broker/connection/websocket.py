"""STOMP over WebSocket: the broker's ``ws://`` port, for browsers (stompjs) and web relays.

Theory of operation
-------------------
A WebSocket connection is a client connection like any other: after the HTTP upgrade
it carries the same STOMP frames, so it is served by the same
:class:`~.protocol.BrokerConnection` as the TCP port, built by the same factory with the
same :class:`~.context.BrokerContext`. It counts toward ``max_connections``, passes the
same authentication, pre-authentication limits, frame limits, flow control and
heart-beats, and shows in the console and ``/metrics`` (its ``transport`` is ``ws``).
Only the bytes' envelope differs, and that is all this module does (composition, as
uvicorn's protocols wrap h11: nothing inherits from the STOMP connection).

:class:`WebSocketProtocol` is the asyncio protocol of the socket. It drives
``wsproto`` (sans-IO, the h11 authors' WebSocket state machine):

1. **Handshake.** The HTTP ``GET`` with ``Upgrade: websocket`` is checked: the
   ``Origin`` (when the browser sends one) must be allowed by ``ws_allowed_origins``
   (``*`` allows any; a client that sends no ``Origin`` is not a browser and is let
   through), and the subprotocol is the first of the client's ``Sec-WebSocket-Protocol``
   list that we speak (``v12.stomp``, ``v11.stomp``, ``v10.stomp``, ``stomp``), as
   ActiveMQ's and RabbitMQ's WebSocket endpoints choose; a client that offers none is
   accepted without one (STOMP's own ``accept-version`` negotiates), one that offers
   only others is refused (400). Any path is accepted, as ActiveMQ does (``/ws`` and
   ``/stomp`` are what the docs use). A handshake not finished within
   ``connect_timeout_ms`` is dropped. A refusal is an HTTP status with a reason, logged.
2. **Messages.** The payload of every text or binary message, as it arrives (partial
   messages included: nothing is buffered beyond one socket read), is fed to the inner
   connection's ``data_received``, the messages of one read in one call; STOMP's
   incremental parser and its limits do the rest, so a frame may span messages and a
   message may hold many frames, as stompjs allows.
3. **Output.** The inner connection writes through :class:`_StompOverWebSocket`, an
   ``asyncio.Transport`` whose ``write`` sends one WebSocket message per write (the
   broker already coalesces a loop turn's frames into one write): a text message while
   the client writes text and the bytes are UTF-8, else a binary one. Flow control
   passes through: the socket's ``pause_writing``/``resume_writing`` reach the inner
   connection, its ``pause_reading`` reaches the socket.
4. **Close.** A client's close frame is answered and the socket closed; the inner
   connection's ``close()`` sends a close frame (1000) first, ``abort()`` cuts the
   socket. Ping is answered by wsproto's pong.

The listener is started and stopped with the client port by
:class:`~amqtransport.broker.server.BrokerServer`, so an HA slave's WebSocket port is
closed until it takes over, exactly as its STOMP port is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

__all__ = ["STOMP_SUBPROTOCOLS", "WebSocketProtocol", "choose_subprotocol", "origin_allowed"]

log = logging.getLogger(__name__)

#: the subprotocols we speak, as ActiveMQ and RabbitMQ name them
STOMP_SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp", "stomp")


def choose_subprotocol(offered: Sequence[str]) -> str | None:
    """The first of the client's ``offered`` subprotocols that we speak; None when it
    offered none (accepted: STOMP's ``accept-version`` negotiates). ValueError when it
    offered only subprotocols we do not speak."""
    if not offered:
        return None
    for name in offered:
        if name.strip().lower() in STOMP_SUBPROTOCOLS:
            return name.strip()
    raise ValueError(f"none of the offered subprotocols {', '.join(offered)} is STOMP "
                     f"(this endpoint speaks {', '.join(STOMP_SUBPROTOCOLS)})")


def origin_allowed(origin: str | None, allowed: Sequence[str]) -> bool:
    """A browser's ``Origin`` against ``ws_allowed_origins`` (``*`` allows any; no
    ``Origin`` at all: not a browser, allowed)."""
    if origin is None:
        return True
    origin = origin.strip().rstrip("/").lower()
    return any(a == "*" or a.strip().rstrip("/").lower() == origin for a in allowed)


class _StompOverWebSocket(asyncio.Transport):
    """What the inner STOMP connection writes to: one WebSocket message per write."""

    def __init__(self, outer: WebSocketProtocol) -> None:
        super().__init__()
        self._outer = outer

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._outer.send_payload(bytes(data))

    def close(self) -> None:
        self._outer.close_websocket(1000, "")

    def abort(self) -> None:
        self._outer.abort()

    def is_closing(self) -> bool:
        return self._outer.closing

    def pause_reading(self) -> None:
        self._outer.transport.pause_reading()

    def resume_reading(self) -> None:
        self._outer.transport.resume_reading()

    def is_reading(self) -> bool:
        return self._outer.transport.is_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "websocket":
            return {"subprotocol": self._outer.subprotocol, "path": self._outer.path}
        return self._outer.transport.get_extra_info(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._outer.transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._outer.transport.get_write_buffer_size()


class WebSocketProtocol(asyncio.Protocol):
    """One WebSocket client socket; the STOMP connection inside it is built by ``factory``
    once the handshake is accepted."""

    def __init__(
        self,
        factory: Callable[[], asyncio.Protocol],
        *,
        allowed_origins: Sequence[str] = ("*",),
        handshake_timeout: float = 10.0,
    ) -> None:
        self._factory = factory
        self._allowed = tuple(allowed_origins)
        self._handshake_timeout = handshake_timeout
        self._ws = WSConnection(ConnectionType.SERVER)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.inner: asyncio.Protocol | None = None
        self.subprotocol: str | None = None
        self.path = ""
        self.closing = False
        self._text = True  # reply in the kind of message the client sends
        self._timer: asyncio.TimerHandle | None = None
        self.peer = "?"

    # ------------------------------------------------------------------ asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._timer = asyncio.get_running_loop().call_later(self._handshake_timeout, self._handshake_late)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        try:
            self._ws.receive_data(data)
            payload: list[bytes] = []  # the messages of this read, fed to STOMP in one call
            for event in self._ws.events():
                if isinstance(event, Message) and self.inner is not None:
                    self._text = isinstance(event, TextMessage)
                    payload.append(event.data.encode("utf-8") if isinstance(event, TextMessage) else bytes(event.data))
                    continue
                self._feed(payload)
                self._event(event)
                if self.closing:
                    return
            self._feed(payload)
        except RemoteProtocolError as exc:
            log.info("websocket client %s: %s", self.peer, exc)
            if self.inner is None:
                self._reject(exc.event_hint.status_code if isinstance(exc.event_hint, RejectConnection) else 400,
                             f"bad WebSocket handshake: {exc}")
            else:
                self.close_websocket(1002, f"protocol error: {exc}"[:120])

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    # ------------------------------------------------------------------ events
    def _feed(self, payload: list[bytes]) -> None:
        """Hand the messages read so far to the STOMP connection (one call: a byte stream)."""
        if payload and self.inner is not None and not self.closing:
            data = b"".join(payload)
            payload.clear()
            if data:
                self.inner.data_received(data)

    def _event(self, event: object) -> None:
        if isinstance(event, Request):
            self._handshake(event)
        elif isinstance(event, CloseConnection):
            if self._ws.state.name == "REMOTE_CLOSING":
                self.transport.write(self._ws.send(event.response()))
            self.closing = True
            self.transport.close()
        elif isinstance(event, Ping):
            self.transport.write(self._ws.send(event.response()))

    def _handshake(self, request: Request) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.extra_headers}
        origin = headers.get("origin")
        if not origin_allowed(origin, self._allowed):
            self._reject(403, f"origin {origin} is not allowed (ws_allowed_origins)")
            return
        try:
            self.subprotocol = choose_subprotocol(request.subprotocols)
        except ValueError as exc:
            self._reject(400, str(exc))
            return
        self.path = request.target
        self.transport.write(self._ws.send(AcceptConnection(subprotocol=self.subprotocol)))
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        inner = self._factory()
        self.inner = inner
        inner.connection_made(_StompOverWebSocket(self))

    def _reject(self, status: int, reason: str) -> None:
        log.warning("websocket client %s refused (%d): %s", self.peer, status, reason)
        body = (reason + "\n").encode("utf-8")
        try:
            self.transport.write(self._ws.send(RejectConnection(
                status_code=status, headers=[(b"content-type", b"text/plain; charset=utf-8"),
                                             (b"content-length", str(len(body)).encode())], has_body=True)))
            self.transport.write(self._ws.send(RejectData(data=body)))
        except LocalProtocolError:  # the handshake was too broken to answer with HTTP
            pass
        self.closing = True
        self.transport.close()

    def _handshake_late(self) -> None:
        self._timer = None
        if self.inner is None and not self.closing:
            log.info("websocket client %s: no WebSocket handshake within %.1f s, closing", self.peer,
                     self._handshake_timeout)
            self.closing = True
            self.transport.abort()

    # ------------------------------------------------------------------ output (the inner connection's)
    def send_payload(self, data: bytes) -> None:
        """One write of the STOMP connection, as one WebSocket message."""
        if self.closing or not data:
            return
        message: Message[Any]
        if self._text:
            try:
                message = TextMessage(data=data.decode("utf-8"))
            except UnicodeDecodeError:
                message = BytesMessage(data=data)
        else:
            message = BytesMessage(data=data)
        self.transport.write(self._ws.send(message))

    def close_websocket(self, code: int, reason: str) -> None:
        """Close with a close frame (what the STOMP connection's ``close()`` means)."""
        if self.closing:
            return
        self.closing = True
        try:
            self.transport.write(self._ws.send(CloseConnection(code=code, reason=reason)))
        except LocalProtocolError:
            pass
        self.transport.close()

    def abort(self) -> None:
        self.closing = True
        self.transport.abort()
