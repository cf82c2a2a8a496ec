"""The interface between the client layer and its transports: :class:`Transport`,
:class:`Receipt` and the listener protocol.

Theory of operation
-------------------
The client layer (``client.py``) talks to one :class:`Transport` whatever the URI: a
direct link (``link.DirectTransport``) or a failover over several
(``failover.FailoverTransport``). It writes requests and gets a :class:`Receipt` for
each one that asks the broker for a RECEIPT; ``wait()`` blocks until the broker
answered, the request failed, or the timeout. Frames the broker sends come back
through :meth:`Transport._dispatch` (on the link's reader): a MESSAGE goes to
``on_message`` with the generation of the link it came on (ACKs are only valid on
that link), a RECEIPT completes its request, an ERROR fails the request it names or,
naming none, ends the link.

Listeners follow :class:`TransportListener`: ``on_interrupted(error)``,
``on_resumed(address)``, ``on_failed(error)``; each is optional and called in the
transport's thread; a raising listener is logged and skipped.
"""

from __future__ import annotations

import _thread
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from amqtransport.errors import BrokerError
from amqtransport.stomp import IDEMPOTENCY_HEADER, Frame
from amqtransport.stomp.session import error_from_frame
from amqtransport.transports.dialect import Dialect, dialect_named

__all__ = [
    "LISTENER_EVENTS",
    "Link",
    "MessageHandler",
    "Receipt",
    "Transport",
    "TransportListener",
    "call_listeners",
    "request_error",
    "with_receipt",
]

log = logging.getLogger(__name__)


class Receipt:
    """A request waiting for the broker's RECEIPT (a tiny future on a raw lock,
    cheaper than ``threading.Event`` on the per-message path)."""

    __slots__ = ("receipt_id", "frame", "_gate", "_done", "error", "result", "tracked", "generation", "tx",
                 "receipt_position")

    def __init__(self, receipt_id: str, frame: Frame, *, tracked: bool = True, tx: str | None = None) -> None:
        self.receipt_id = receipt_id
        self.frame = frame
        self._gate = _thread.allocate_lock()
        self._gate.acquire()
        self._done = False
        self.error: BaseException | None = None
        self.result: Frame | None = None
        self.tracked = tracked
        self.generation = 0
        self.tx = tx
        #: position of its latest write among the link's writes (the failover transport's),
        #: taken before the write: its RECEIPT proves every write before this position
        self.receipt_position: int | None = None

    @property
    def done(self) -> bool:
        return self._done

    def _finish(self) -> None:
        if not self._done:
            self._done = True
            self._gate.release()

    def set_result(self, frame: Frame) -> None:
        if not self._done:
            self.result = frame
            self._finish()

    def set_error(self, error: BaseException) -> None:
        if not self._done:
            self.error = error
            self._finish()

    def wait_event(self, timeout: float | None) -> bool:
        if self._done:
            return True
        if self._gate.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            self._gate.release()  # let any other waiter through too
        return self._done


def request_error(rec: Receipt, frame: Frame) -> BrokerError:
    """The error for request ``rec``, refused by the broker with ERROR ``frame``: it
    carries the request's idempotency key (the key to resend it with)."""
    err = error_from_frame(frame)
    err.idempotency_key = rec.frame.get(IDEMPOTENCY_HEADER)
    return err


def with_receipt(frame: Frame, receipt_id: str) -> Frame:
    """``frame`` with a ``receipt`` header (fast path when it has none)."""
    if "receipt" in frame:
        return frame.with_headers(receipt=receipt_id)
    return Frame(frame.command, frame.headers + (("receipt", receipt_id),), frame.body)


class Link(Protocol):
    """What a transport needs of one link (``link.StompConnection`` is the one)."""

    #: its CONNECTED frame (None before the handshake)
    connected_frame: Frame | None
    #: the ERROR frame, tied to no request, that ended it
    error_frame: Frame | None
    dialect: Dialect
    duplicate_id_header: str | None

    @property
    def alive(self) -> bool: ...

    def end_with_error(self, frame: Frame) -> None: ...


class TransportListener(Protocol):
    """What a transport tells its listeners (every method optional: a listener defines
    those it wants; a raising listener is logged and skipped)."""

    def on_interrupted(self, error: BaseException) -> None:
        """The link was lost; requests wait for the next link (failover only)."""

    def on_resumed(self, address: str) -> None:
        """A new link to ``address`` is up and the replay is written."""

    def on_failed(self, error: BaseException) -> None:
        """The transport gave up (the schedule is exhausted or a fatal error)."""


#: the events of :class:`TransportListener`
LISTENER_EVENTS = ("on_interrupted", "on_resumed", "on_failed")


def call_listeners(listeners: Sequence[object], method: str, *args: object) -> None:
    """Call ``method`` on every listener that has it, in order; a raising listener is
    logged and skipped so user bugs cannot break the caller's loop."""
    for listener in list(listeners):
        fn = getattr(listener, method, None)
        if fn is None:
            continue
        try:
            fn(*args)
        except Exception:
            log.exception("listener %r.%s raised; ignored", listener, method)


MessageHandler = Callable[[Frame, int], None]


class Transport:
    """Common base: receipts, dispatch, listeners. Subclasses own the link(s)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._pending: dict[str, Receipt] = {}
        self._ids = itertools.count(1)
        self._listeners: list[object] = []
        self.on_message: MessageHandler | None = None
        self.on_broker_error: Callable[[Frame], None] | None = None
        self._generation = 0
        self._closed = False
        self._last_dialect = dialect_named("generic")

    @property
    def generation(self) -> int:
        """The number of the current link (raised by each new link; ACKs carry it)."""
        return self._generation

    # -- to implement ---------------------------------------------------------------
    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    @property
    def connected_address(self) -> str | None:
        raise NotImplementedError

    @property
    def is_connected(self) -> bool:
        raise NotImplementedError

    @property
    def version(self) -> str:
        raise NotImplementedError

    @property
    def link(self) -> Link | None:
        """The current link (None before the first one and while reconnecting)."""
        raise NotImplementedError

    @property
    def connected_frame(self) -> Frame | None:
        """The CONNECTED frame of the current link (None while disconnected)."""
        conn = self.link
        return conn.connected_frame if conn is not None and conn.alive else None

    @property
    def dialect(self) -> Dialect:
        """The dialect of the current link, else of the last one (``generic`` before any)."""
        conn = self.link
        if conn is not None and conn.connected_frame is not None:
            self._last_dialect = conn.dialect
        return self._last_dialect

    @property
    def duplicate_id_header(self) -> str | None:
        """The header that also carries the idempotency key on the current link."""
        conn = self.link
        return conn.duplicate_id_header if conn is not None else None

    def request(self, frame: Frame, *, receipt: bool = True) -> Receipt | None:
        raise NotImplementedError

    def wait(self, receipt: Receipt, timeout: float | None = None) -> Frame:
        raise NotImplementedError

    def write_if_current(self, frame: Frame, generation: int) -> bool:
        """Write ``frame`` only on link ``generation`` (ACK/NACK); False when stale."""
        raise NotImplementedError

    def write_many_if_current(self, frames: list[Frame], generation: int) -> bool:
        """Write ``frames`` in order, in one socket write, only on link ``generation``
        (batched ACKs); False when stale or the write failed (then none may have gone)."""
        return all(self.write_if_current(frame, generation) for frame in frames)

    def subscribe(self, sub_id: str, frame: Frame) -> Receipt:
        raise NotImplementedError

    def unsubscribe(self, sub_id: str, frame: Frame) -> Receipt | None:
        raise NotImplementedError

    def begin(self, tx_id: str) -> Receipt:
        raise NotImplementedError

    def commit(self, tx_id: str) -> Receipt:
        raise NotImplementedError

    def abort(self, tx_id: str) -> None:
        raise NotImplementedError

    def tx_done(self, tx_id: str) -> None:
        """Forget a finished transaction."""

    # -- shared -------------------------------------------------------------------------
    def add_listener(self, listener: object) -> None:
        """Add a :class:`TransportListener` (an object with any of its methods)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: object) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _notify(self, method: str, *args: object) -> None:
        call_listeners(self._listeners, method, *args)

    def next_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def _dispatch(self, frame: Frame, generation: int, conn: Link | None = None) -> None:
        """Handle one frame from link ``conn`` of ``generation`` (reader thread)."""
        command = frame.command
        if command == "MESSAGE":
            handler = self.on_message
            if handler is not None:
                handler(frame, generation)
        elif command == "RECEIPT":
            rid = frame.get("receipt-id")
            with self._lock:
                rec = self._pending.pop(rid, None) if rid is not None else None
            if rec is not None:
                rec.set_result(frame)
        elif command == "ERROR":
            self._on_error(conn, frame)

    def _on_error(self, conn: Link | None, frame: Frame) -> None:
        """An ERROR frame: it fails the request whose ``receipt-id`` it carries; one that
        names no request ends the link (:meth:`Link.end_with_error`)."""
        rid = frame.get("receipt-id")
        with self._lock:
            rec = self._pending.pop(rid, None) if rid is not None else None
        if rec is not None:
            self._request_refused(rec)
            rec.set_error(request_error(rec, frame))
            return
        log.warning("broker ERROR (not tied to a request; ending the link): %s", error_from_frame(frame))
        self._on_unmatched_error(frame)
        if self.on_broker_error is not None:
            try:
                self.on_broker_error(frame)
            except Exception:
                log.exception("broker-error handler failed")
        if conn is not None:
            conn.end_with_error(frame)

    def _request_refused(self, rec: Receipt) -> None:
        """``rec`` failed with a broker ERROR (hook; the lock is not held)."""

    def _on_unmatched_error(self, frame: Frame) -> None:
        """An ERROR frame not tied to a request (the link is ended right after)."""
