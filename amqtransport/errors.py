"""The amqtransport exception family.

One flat family rooted at :class:`AmqTransportError`, in the manner of httpcore:
operating-system errors are mapped into this family once, at the I/O boundary
(``amqtransport._backends``), so code above never sees ``OSError`` or ``ssl.SSLError``.

This module imports nothing from the project: it is the lowest layer and every other
layer (including the sans-IO ``stomp`` package) may import it.

    AmqTransportError
    ├── UriError (also ValueError)          bad connection URI or option
    ├── ConfigError (also ValueError)       bad config file key or value
    ├── DestinationError (also ValueError)  bad destination name or wildcard pattern
    ├── ProtocolError                       malformed STOMP
    │   ├── LocalProtocolError              we were asked to emit something invalid
    │   └── RemoteProtocolError             the peer sent something invalid
    ├── TransportError                      recoverable: failover catches this family
    │   ├── ConnectError
    │   │   └── ConnectRefused              nothing serves there (refused, or closed with no answer)
    │   ├── ReadError
    │   ├── WriteError
    │   ├── ConnectionClosed
    │   └── HeartbeatTimeout
    ├── BrokerError                         the broker answered with an ERROR frame
    │   └── AuthenticationError
    ├── ReconnectExhausted                  failover gave up (maxReconnectAttempts)
    ├── SendTimeout                         failover ``timeout`` elapsed while disconnected
    ├── RequestTimeout                      ``conn.request()`` got no reply in time
    ├── TransactionRolledBack               a transaction spanned a failover
│   └── TransactionInDoubt              the link died while its COMMIT was in flight
└── ServerError                         raised by the broker's own code (store, core, HA,
                                        console); a client meets it as an ERROR frame
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "AmqTransportError",
    "UriError",
    "ConfigError",
    "DestinationError",
    "ProtocolError",
    "LocalProtocolError",
    "RemoteProtocolError",
    "TransportError",
    "ConnectError",
    "ConnectRefused",
    "ReadError",
    "WriteError",
    "ConnectionClosed",
    "HeartbeatTimeout",
    "BrokerError",
    "AuthenticationError",
    "ReconnectExhausted",
    "SendTimeout",
    "RequestTimeout",
    "TransactionRolledBack",
    "TransactionInDoubt",
    "ServerError",
]


class AmqTransportError(Exception):
    """Root of every error raised by amqtransport."""


class UriError(AmqTransportError, ValueError):
    """A connection URI (or one of its options) is invalid.

    ``option`` names the offending option, ``column`` the 1-based position in the
    URI text where parsing failed, ``valid`` the names that would have been accepted.
    """

    def __init__(
        self,
        message: str,
        *,
        uri: str | None = None,
        option: str | None = None,
        column: int | None = None,
        valid: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.uri = uri
        self.option = option
        self.column = column
        self.valid = tuple(valid)


class ConfigError(AmqTransportError, ValueError):
    """A configuration file has an unknown key or a bad value; ``path`` names it."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class DestinationError(AmqTransportError, ValueError):
    """A destination name or wildcard pattern is not valid (``amqtransport.destinations``)."""


class ProtocolError(AmqTransportError):
    """STOMP framing or protocol violation."""


class LocalProtocolError(ProtocolError):
    """We were asked to produce something that is not valid STOMP."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that are not valid STOMP (or broke a limit)."""


class TransportError(AmqTransportError):
    """A connection-level failure. Recoverable: the failover layer catches this family."""


class ConnectError(TransportError):
    """Could not establish a connection (refused, unreachable, TLS handshake, timeout)."""


class ConnectRefused(ConnectError):
    """Nothing serves there (yet): the TCP connect was refused, or the connection was
    closed or reset before any byte of an answer to CONNECT (a proxy in front of a
    refusing broker). A failover reconnect probes such an endpoint while a CONNECT
    elsewhere goes unanswered."""


class ReadError(TransportError):
    """Reading from an established connection failed."""


class WriteError(TransportError):
    """Writing to an established connection failed."""


class ConnectionClosed(TransportError):
    """The connection was closed (by the peer, or locally while an operation waited)."""


class HeartbeatTimeout(TransportError):
    """No bytes from the peer within the negotiated heart-beat deadline (half-open)."""


class BrokerError(AmqTransportError):
    """The broker sent an ERROR frame. ``frame`` carries it (headers and body).

    For an ERROR that answers a SEND, ``idempotency_key`` is the key the send went with
    (the caller's or the one the client generated); :attr:`in_doubt` says whether the
    broker could not tell if it took effect."""

    def __init__(self, message: str, *, frame: Any = None, idempotency_key: str | None = None) -> None:
        super().__init__(message)
        self.frame = frame
        self.idempotency_key = idempotency_key

    @property
    def in_doubt(self) -> bool:
        """The broker could not say whether the request took effect (``amq-in-doubt:true``:
        its record was queued when the journal failed, e.g. on a full disk). Resend a SEND
        with the same ``idempotency_key`` once the broker is back: its dedupe drops the
        copy if the first one was stored. Otherwise the ERROR means "not applied"."""
        return self.frame is not None and self.frame.get("amq-in-doubt") == "true"  # stomp.IN_DOUBT_HEADER


class AuthenticationError(BrokerError):
    """The broker refused the login/passcode."""


class ReconnectExhausted(AmqTransportError):
    """The failover layer used up ``maxReconnectAttempts`` (or it was 0 after a failure)."""

    def __init__(self, message: str, *, attempts: int = 0, last_error: BaseException | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.last_error = last_error


class SendTimeout(AmqTransportError):
    """A send waited longer than the failover ``timeout`` while disconnected (or longer
    than the caller's own timeout for its receipt).

    The message may or may not have reached a broker. ``idempotency_key`` is the key it
    was sent with (None for a frame that carried none): send it again with the same key
    and a broker that honours the key stores it once. ``receipt_id`` names the request.
    """

    def __init__(self, message: str, *, idempotency_key: str | None = None, receipt_id: str | None = None) -> None:
        super().__init__(message)
        self.idempotency_key = idempotency_key
        self.receipt_id = receipt_id


class RequestTimeout(AmqTransportError):
    """``conn.request()`` got no reply within its ``timeout`` (or ``conn.browse()`` no
    ``browser:end``).

    The request may have been served: a reply that comes later is dropped, never handed
    to anyone. ``correlation_id`` names the request (its ``correlation-id`` header) and
    ``destination`` where it was sent."""

    def __init__(self, message: str, *, correlation_id: str | None = None, destination: str | None = None) -> None:
        super().__init__(message)
        self.correlation_id = correlation_id
        self.destination = destination


class TransactionRolledBack(AmqTransportError):
    """A transaction was open across a failover; its commit cannot succeed.

    ``keys`` holds the idempotency keys of the transaction's sends, in order, so the
    caller can send them again in a new transaction."""

    def __init__(self, message: str, *, transaction: str | None = None, keys: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.transaction = transaction
        self.keys = tuple(keys)


class TransactionInDoubt(TransactionRolledBack):
    """The link died after the COMMIT was written and before its receipt arrived: the
    broker may have committed the transaction or rolled it back, nobody can tell.

    A subclass of :class:`TransactionRolledBack` so existing ``except`` clauses still
    catch it, but do not read it as "nothing was stored": the safe recovery is to send
    the same messages again with the same idempotency keys (``keys``); a broker that
    honours the key (ours, Artemis with ``_AMQ_DUPL_ID``) drops those it already
    committed, elsewhere the consumer's duplicate filter removes the copies."""


class ServerError(AmqTransportError):
    """Raised by the broker's own code rather than received from a broker: the journal
    (``JournalError``, also an ``OSError``), records and checkpoints, the core's refusal
    of a request (``CoreError``), replication and the HA helpers (``ReplicationError``;
    ``NodeUnreachable`` where an HA node cannot be reached, also an ``OSError``), the web
    console's actions (``AdminError``). A client of the broker never sees these
    classes: it gets an ERROR frame, which it raises as :class:`BrokerError`."""
