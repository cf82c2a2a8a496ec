"""The STOMP session, sans-IO: the CONNECT/CONNECTED handshake, ERROR frames, ACK/NACK.

Theory of operation
-------------------
A client link starts with one exchange: it writes a CONNECT frame and reads until the
broker answers CONNECTED (or ERROR). :class:`ClientSession` is that exchange without
I/O, in the codec's manner: the caller writes :meth:`ClientSession.connect_bytes`,
then hands every chunk it reads to :meth:`ClientSession.feed` until it returns the
:class:`Negotiated` terms (the version both sides speak, the heart-beat intervals in
each direction, the CONNECTED frame itself). An ERROR answer raises its error
(:func:`error_from_frame`: :class:`~amqtransport.errors.AuthenticationError` when the
broker refused the credentials or access, else
:class:`~amqtransport.errors.BrokerError`); anything else a broker could not have
meant raises :class:`~amqtransport.errors.ConnectError` naming it. The parser the
session fed is kept (:attr:`ClientSession.parser`, switched to the negotiated version)
so bytes that followed CONNECTED in the same read are not lost to the link's reader.

Every client of this project handshakes through it: the client links of both drivers
(threads and asyncio), the HA requests, and the test harnesses' readiness probe.

The other side of the exchange, :class:`ServerSession`, reads the one CONNECT a
connection opens with (heart-beat EOLs before it are skipped; a malformed frame raises
:class:`~amqtransport.errors.RemoteProtocolError`): the HA port of our broker answers
its requests through it.

What a broker's ERROR means is decided once, here: :func:`error_text` (its ``message``
header and body, which is where RabbitMQ puts the reason) and :func:`error_from_frame`
(the classification). So is the shape of an acknowledgement, which differs between the
versions: :func:`ack_frame` builds ACK/NACK for a received MESSAGE (1.2 names the
MESSAGE's ``ack`` header as ``id``; 1.1 names ``message-id`` and ``subscription``;
1.0 has only ``message-id`` and no NACK) and :func:`parse_ack` reads one back.

No socket, thread or clock here (the layering test checks it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from amqtransport.errors import (
    AuthenticationError,
    BrokerError,
    ConnectError,
    ConnectRefused,
    LocalProtocolError,
    RemoteProtocolError,
)

from .frames import NEED_DATA, Frame
from .heartbeat import format_heartbeat_header, negotiate_heartbeat, parse_heartbeat_header
from .limits import Limits
from .negotiation import negotiate_version
from .parser import FrameParser
from .serializer import serialize
from .versions import SUPPORTED_VERSIONS

__all__ = [
    "ACCEPT_VERSIONS",
    "AckRef",
    "ClientSession",
    "Negotiated",
    "ServerSession",
    "ack_frame",
    "connect_frame",
    "error_from_frame",
    "error_text",
    "parse_ack",
]

#: what a client offers in ``accept-version``
ACCEPT_VERSIONS = ",".join(SUPPORTED_VERSIONS)

# in the ERROR's message header (short, chosen by the broker for this purpose)
_AUTH_WORDS = ("auth", "login", "password", "passcode", "credential", "security", "not authorized", "access denied",
               "access refused")
# in its body (free text: only unambiguous phrases)
_AUTH_PHRASES = ("access refused", "access denied", "not authorized", "authentication failed", "bad credentials",
                 "invalid credentials", "login failed")


def error_text(frame: Frame) -> str:
    """One line for an ERROR frame: its ``message`` header and its body (where brokers
    such as RabbitMQ put the real reason: "Bad CONNECT: Virtual host '127.0.0.1' access
    denied"), the body cut at 300 characters."""
    message = (frame.get("message") or "").strip()
    body = " ".join(frame.body.decode("utf-8", "replace").split())
    if len(body) > 300:
        body = body[:297] + "..."
    if message and body and body != message and message not in body:
        return f"{message}: {body}"
    return body if body and message in body else (message or "ERROR frame")


def error_from_frame(frame: Frame, context: str = "") -> BrokerError:
    """A :class:`BrokerError` for an ERROR frame, or an :class:`AuthenticationError` when
    the broker refused the credentials or access (its message or body says so)."""
    text = error_text(frame)
    message = (frame.get("message") or "").lower()
    body = frame.body[:1000].decode("utf-8", "replace").lower()
    if any(word in message for word in _AUTH_WORDS) or any(phrase in body for phrase in _AUTH_PHRASES):
        return AuthenticationError(f"{context}{text}", frame=frame)
    return BrokerError(f"{context}{text}", frame=frame)


def connect_frame(
    *,
    host: str,
    login: str | None = None,
    passcode: str | None = None,
    client_id: str | None = None,
    heartbeat: tuple[int, int] = (0, 0),
    accept_version: str = ACCEPT_VERSIONS,
    extra_headers: Iterable[tuple[str, str]] = (),
) -> Frame:
    """The CONNECT frame (headers in this order: ``accept-version``, ``host``, ``login``,
    ``passcode``, ``client-id``, ``heart-beat``, then ``extra_headers``)."""
    headers: list[tuple[str, str]] = [("accept-version", accept_version), ("host", host)]
    if login is not None:
        headers.append(("login", login))
    if passcode is not None:
        headers.append(("passcode", passcode))
    if client_id is not None:
        headers.append(("client-id", client_id))
    headers.append(("heart-beat", format_heartbeat_header(heartbeat)))
    headers.extend(extra_headers)
    return Frame.make("CONNECT", headers)


@dataclass(frozen=True)
class Negotiated:
    """What a CONNECTED settled for one link."""

    #: the STOMP version both sides speak
    version: str
    #: we write a heart-beat when we wrote nothing for this long (ms; 0: never)
    send_every_ms: int
    #: the broker promised to write at least this often (ms; 0: no promise)
    expect_every_ms: int
    #: the CONNECTED frame
    frame: Frame

    @property
    def server(self) -> str | None:
        """The broker's ``server`` header (its name and version), if any."""
        return self.frame.get("server")


class ClientSession:
    """One client-side CONNECT/CONNECTED exchange (see the module docstring).

    ``heartbeat`` is what we offer, ``(we can send every, we want every)`` in ms;
    ``min_heartbeat_ms`` raises each non-zero value to a broker's floor (Artemis refuses
    less than 500 ms). ``context`` prefixes every error (the peer's address)."""

    def __init__(
        self,
        *,
        host: str = "/",
        login: str | None = None,
        passcode: str | None = None,
        client_id: str | None = None,
        heartbeat: tuple[int, int] = (0, 0),
        min_heartbeat_ms: int = 0,
        accept_version: str = ACCEPT_VERSIONS,
        extra_headers: Iterable[tuple[str, str]] = (),
        context: str = "",
    ) -> None:
        cx, cy = int(heartbeat[0]), int(heartbeat[1])
        if min_heartbeat_ms:
            cx, cy = cx and max(cx, min_heartbeat_ms), cy and max(cy, min_heartbeat_ms)
        #: the heart-beat we offer, after the floor
        self.heartbeat = (cx, cy)
        self.context = context
        self.frame = connect_frame(host=host, login=login, passcode=passcode, client_id=client_id,
                                   heartbeat=self.heartbeat, accept_version=accept_version,
                                   extra_headers=extra_headers)
        #: the parser fed so far; after CONNECTED it speaks the negotiated version
        self.parser = FrameParser("1.2")
        self.result: Negotiated | None = None
        self._answered = False  # a byte came from the broker

    def connect_bytes(self) -> bytes:
        """The CONNECT frame on the wire (CONNECT headers are never escaped)."""
        return serialize(self.frame, "1.2")

    def feed(self, data: bytes) -> Negotiated | None:
        """Bytes read from the broker; the terms once CONNECTED is complete, else None
        (read more). ``b""`` means the broker closed the connection."""
        if self.result is not None:
            raise LocalProtocolError("the handshake is over: feed the link's reader instead")
        if data == b"":
            raise self.closed()
        self._answered = True
        try:
            self.parser.feed(data)
            while True:
                event = self.parser.next_event()
                if event is NEED_DATA:
                    return None
                if isinstance(event, Frame):
                    return self.receive(event)
        except RemoteProtocolError as exc:
            raise ConnectError(f"{self.context}bad handshake: {exc}") from exc

    def closed(self, reset: str | None = None) -> ConnectError:
        """The error for a connection the broker closed (``reset``: why it was reset, else
        an end of stream) during the handshake. Before any byte of an answer it is a
        refusal, :class:`ConnectRefused`: nothing serves there (a proxy accepts the TCP
        connect first and closes it when its upstream refuses)."""
        how = f"connection reset ({reset})" if reset else "connection closed"
        if not self._answered:
            return ConnectRefused(f"{self.context}{how} during the STOMP handshake, before any answer to CONNECT "
                                  "(nothing serves there)")
        return ConnectError(f"{self.context}{how} during the STOMP handshake")

    def receive(self, frame: Frame) -> Negotiated:
        """The broker's answer to CONNECT: the terms, or its error raised."""
        if frame.command == "ERROR":
            raise error_from_frame(frame, f"{self.context}CONNECT refused: ")
        if frame.command != "CONNECTED":
            raise ConnectError(f"{self.context}expected CONNECTED, got {frame.command}")
        try:
            version = negotiate_version(frame.get("version"))
            send, expect = negotiate_heartbeat(self.heartbeat, parse_heartbeat_header(frame.get("heart-beat")))
        except RemoteProtocolError as exc:
            raise ConnectError(f"{self.context}bad handshake: {exc}") from exc
        self.parser.version = version
        self.result = Negotiated(version, send, expect, frame)
        return self.result


class ServerSession:
    """The broker's side of the handshake: the first frame a connection sends (see the
    module docstring); what to answer is the caller's decision."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.parser = FrameParser("1.2", limits if limits is not None else Limits())
        #: the first frame, once complete
        self.request: Frame | None = None

    def feed(self, data: bytes) -> Frame | None:
        """Bytes read from the client; its first frame once complete, else None."""
        if self.request is not None:
            raise LocalProtocolError("the handshake is over: feed the connection's reader instead")
        self.parser.feed(data)
        while True:
            event = self.parser.next_event()
            if event is NEED_DATA:
                return None
            if isinstance(event, Frame):  # anything else is a heart-beat EOL before it
                self.request = event
                return event


# -- acknowledgements ----------------------------------------------------------------------


def ack_frame(command: str, message: Frame, version: str, *, transaction: str | None = None) -> Frame:
    """ACK or NACK of a received MESSAGE, as ``version`` spells it (module docstring).
    NACK does not exist in STOMP 1.0: :class:`LocalProtocolError`."""
    if command not in ("ACK", "NACK"):
        raise LocalProtocolError(f"expected ACK or NACK, got {command!r}")
    if version == "1.2":
        headers: list[tuple[str, str]] = [("id", message.get("ack") or message.get("message-id") or "")]
    elif version == "1.0" and command == "NACK":
        raise LocalProtocolError("NACK needs STOMP 1.1 or later")
    else:
        headers = [("message-id", message.get("message-id") or "")]
        if version == "1.1":
            headers.append(("subscription", message.get("subscription") or ""))
    if transaction is not None:
        headers.insert(0, ("transaction", transaction))
    return Frame(command, tuple(headers))


@dataclass(frozen=True)
class AckRef:
    """What an ACK/NACK names: the delivery (``id`` in 1.2, ``message-id`` before) and,
    in 1.1, the subscription."""

    id: str
    subscription: str | None = None
    transaction: str | None = None


def parse_ack(frame: Frame, version: str) -> AckRef:
    """Read an ACK/NACK as ``version`` spells it; a missing header is a
    :class:`RemoteProtocolError` naming it (1.2 also accepts ``message-id``, as
    brokers do for clients that mix the spellings)."""
    if frame.command not in ("ACK", "NACK"):
        raise RemoteProtocolError(f"expected ACK or NACK, got {frame.command}")
    if version == "1.0" and frame.command == "NACK":
        raise RemoteProtocolError("NACK is not part of STOMP 1.0")
    if version == "1.2":
        ack_id = frame.get("id") or frame.get("message-id")
        if ack_id is None:
            raise RemoteProtocolError(f"{frame.command} frame is missing the required 'id' header")
    else:
        ack_id = frame.get("message-id")
        if ack_id is None:
            raise RemoteProtocolError(f"{frame.command} frame is missing the required 'message-id' header")
    subscription = frame.get("subscription") if version == "1.1" else None
    return AckRef(ack_id, subscription, frame.get("transaction"))
