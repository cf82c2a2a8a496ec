"""STOMP over one endpoint: the handshake, a reader thread, heart-beats, receipts.

Theory of operation
-------------------
:class:`StompConnection` is one link to one broker. ``open()`` connects the stream
(through a backend), sends CONNECT (``accept-version``, ``host``, ``login``,
``passcode``, ``heart-beat``, ``client-id``) and reads synchronously until CONNECTED
(or ERROR: :class:`AuthenticationError` / :class:`BrokerError`) within the connect
timeout. It then negotiates the version and the heart-beat intervals and starts:

* a **reader thread** that only reads bytes, feeds the sans-IO parser and hands each
  frame to ``on_frame`` (a callback that must not block: it completes receipts and
  queues messages). While the broker promised heart-beats, the reader waits at most
  until ``last byte received + 2 * interval``; past that the link is declared
  half-open (:class:`HeartbeatTimeout`). End of stream, a read error, a parser
  error or the deadline all end the thread by calling ``on_lost(error)`` exactly
  once (never after a local ``close()``);
* a **heart-beat thread** (only when we promised beats) that writes one EOL when
  nothing else was written for a whole interval.

Writes come from any thread and go through a :class:`CoalescingWriter`: frames
written while another thread's write is on the socket are queued and leave together
in one ``sendall`` (order of the calls kept, each caller still gets the error of the
write that carried its frame). Heart-beats are queued without waiting, so a big send
in flight never blocks the heart-beat thread. A write failure raises to the writer;
detecting the loss and reporting it is the reader's job.

:class:`~amqtransport.transports.base.Transport` (in ``base.py``) is the interface the
client layer uses (requests with receipts, subscriptions, transactions, acks,
listeners); :class:`DirectTransport` implements it
over a single connection with no reconnect: when the link is lost every pending
request fails with the ``TransportError`` that ended it. The failover transport
(``failover.py``) implements the same interface over a sequence of connections.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from amqtransport._backends.base import Backend, NetworkStream, leaf_address
from amqtransport.activemq_options import (
    first_deadline_grace_ms,
    heartbeat_of,
    jms_credentials,
    prefetch_policy,
)
from amqtransport.errors import (
    AmqTransportError,
    ConnectError,
    ConnectionClosed,
    HeartbeatTimeout,
    ReadError,
    RemoteProtocolError,
    TransportError,
)
from amqtransport.stomp import (
    HEARTBEAT_BYTES,
    NEED_DATA,
    Frame,
    FrameParser,
    parse_heartbeat_header,
    serialize,
)
from amqtransport.stomp.session import ClientSession, Negotiated, error_from_frame
from amqtransport.transports.base import Receipt, Transport, call_listeners, with_receipt
from amqtransport.transports.coalesce import CoalescingWriter
from amqtransport.transports.dialect import DEFAULT_VHOST, Dialect, detect, dialect_named
from amqtransport.transports.waiting import send_timeout
from amqtransport.uri import LeafUri

__all__ = [
    "ConnectParams",
    "LinkTerms",
    "connect_timeout_for",
    "handshake_session",
    "link_terms",
    "StompConnection",
    "DirectTransport",
    # re-exported from .base (their home since the split)
    "Receipt",
    "Transport",
    "call_listeners",
    "with_receipt",
]

log = logging.getLogger(__name__)

Clock = Callable[[], float]
#: seconds a link killed by a failed write waits for its reader to deliver what came before
KILL_GRACE = 0.3
@dataclass(frozen=True)
class ConnectParams:
    """What every CONNECT of a connection carries (the same on every reconnect)."""

    login: str | None = None
    passcode: str | None = None
    vhost: str | None = None
    client_id: str | None = None
    heartbeat: tuple[int, int] = (10000, 10000)
    #: seconds; None -> the leaf's connect_timeout option (ms, default 10000)
    connect_timeout: float | None = None
    extra_headers: tuple[tuple[str, str], ...] = field(default=())


def _leaf_heartbeat(leaf: LeafUri, default: tuple[int, int]) -> tuple[int, int]:
    """The leaf's ``heartBeat`` when the URI gives one, else the connection's."""
    options = leaf.options
    if "heart_beat" in options.model_fields_set and options.heart_beat:
        return parse_heartbeat_header(options.heart_beat)
    return heartbeat_of(leaf.amq) or default  # wireFormat.maxInactivityDuration, useInactivityMonitor


def connect_timeout_for(leaf: LeafUri, params: ConnectParams) -> float:
    if params.connect_timeout is not None:
        return float(params.connect_timeout)
    # 0 is ActiveMQ's "no limit" (connectionTimeout=0): a day stands for it
    return leaf.options.connect_timeout / 1000.0 if leaf.options.connect_timeout else 86400.0


def handshake_session(leaf: LeafUri, params: ConnectParams, address: str) -> tuple[ClientSession, Dialect | None]:
    """The STOMP session for a link to ``leaf`` (CONNECT built from ``params`` and the
    leaf's options) and the dialect the URI forces, if any (any link: thread or asyncio)."""
    options = leaf.options
    forced_dialect = dialect_named(options.dialect) if options.dialect else None
    host = params.vhost or options.host or DEFAULT_VHOST
    user, password, client_id = jms_credentials(leaf.amq)  # jms.userName / jms.password / jms.clientID
    session = ClientSession(
        host=str(host), login=params.login if params.login is not None else user,
        passcode=params.passcode if params.passcode is not None else password,
        client_id=params.client_id or client_id, heartbeat=_leaf_heartbeat(leaf, params.heartbeat),
        min_heartbeat_ms=forced_dialect.min_heartbeat_ms if forced_dialect is not None else 0,
        extra_headers=params.extra_headers, context=f"{address}: ")
    return session, forced_dialect


@dataclass(frozen=True)
class LinkTerms:
    """What a link runs with once its handshake is done."""

    connected_frame: Frame
    version: str
    send_every_ms: int
    expect_every_ms: int
    dialect: Dialect
    #: text bodies go without content-length (``textMode``; default per dialect)
    text_mode: bool
    #: a header that also carries the idempotency key (``duplicateIdHeader``)
    duplicate_id_header: str | None


def link_terms(leaf: LeafUri, terms: Negotiated, forced_dialect: Dialect | None) -> LinkTerms:
    """The negotiated terms with the dialect's choices and the leaf's overrides applied."""
    options = leaf.options
    dialect = forced_dialect or detect(terms.frame.get("server"))
    policy = prefetch_policy(leaf.amq)  # jms.prefetchPolicy.*: the subscriptions' default prefetch
    if policy:
        dialect = replace(dialect, prefetch_policy=tuple(sorted(policy.items())))
    text_mode = dialect.text_mode if options.text_mode is None else bool(options.text_mode)
    dup = options.duplicate_id_header
    duplicate_id_header = dialect.duplicate_id_header if dup is None else (None if dup.lower() == "none" else dup)
    return LinkTerms(terms.frame, terms.version, terms.send_every_ms, terms.expect_every_ms, dialect,
                     text_mode, duplicate_id_header)


class StompConnection:
    """One STOMP link to one endpoint. See the module docstring."""

    def __init__(
        self,
        leaf: LeafUri,
        *,
        backend: Backend,
        params: ConnectParams = ConnectParams(),  # noqa: B008 - frozen
        on_frame: Callable[[StompConnection, Frame], None] | None = None,
        on_lost: Callable[[StompConnection, TransportError], None] | None = None,
        clock: Clock = time.monotonic,
        name: str = "",
    ) -> None:
        self.leaf = leaf
        self.address = leaf_address(leaf)
        self._backend = backend
        self._params = params
        self._on_frame = on_frame
        self._on_lost = on_lost
        self._clock = clock
        self._name = name or self.address
        #: the owner's generation number for this link (set by the failover transport)
        self.tag = 0
        self._stream: NetworkStream | None = None
        self._writer: CoalescingWriter | None = None
        self._parser = FrameParser("1.2")
        self.version = "1.2"
        self.connected_frame: Frame | None = None
        #: the ERROR frame, tied to no request, that ended this link (see :meth:`end_with_error`)
        self.error_frame: Frame | None = None
        #: the broker's dialect (the URI's ``dialect`` option, else detected from CONNECTED)
        self.dialect: Dialect = dialect_named("generic")
        #: text bodies go without content-length (``textMode``; default per dialect)
        self.text_mode = False
        #: a header that also carries the idempotency key (``duplicateIdHeader``)
        self.duplicate_id_header: str | None = None
        self.send_every_ms = 0
        self.expect_every_ms = 0
        self._last_rx = 0.0
        self._last_tx = 0.0
        self._closing = False
        self._lost_reported = False
        self._lost_lock = threading.Lock()
        self._stop = threading.Event()
        self._reader: threading.Thread | None = None
        self._beater: threading.Thread | None = None

    # -- handshake ------------------------------------------------------------------

    def open(self) -> Frame:
        """Connect and complete the STOMP handshake (:class:`ClientSession`); return the
        CONNECTED frame."""
        timeout = connect_timeout_for(self.leaf, self._params)
        deadline = self._clock() + timeout
        session, forced_dialect = handshake_session(self.leaf, self._params, self.address)
        stream = self._backend.connect(self.leaf, timeout)
        self._stream = stream
        if self._closing:  # closed from another thread while connecting (a failover abandoned it)
            stream.close()
            raise ConnectionClosed(f"{self.address}: closed while connecting")
        try:
            try:
                stream.write(session.connect_bytes())
            except TransportError as exc:  # e.g. a TLS peer that rejected our certificate
                raise ConnectError(f"{self.address}: handshake failed: {exc}") from exc
            terms = link_terms(self.leaf, self._read_handshake(stream, session, deadline), forced_dialect)
            frame = terms.connected_frame
            self.version = terms.version
            self._parser = session.parser
            self.send_every_ms, self.expect_every_ms = terms.send_every_ms, terms.expect_every_ms
            self.connected_frame = frame
            self.dialect = terms.dialect
            self.text_mode = terms.text_mode
            self.duplicate_id_header = terms.duplicate_id_header
        except BaseException:
            stream.close()
            raise
        now = self._clock()
        self._last_rx = self._last_tx = now
        # wireFormat.maxInactivityDurationInitalDelay: the first deadline comes no sooner than this
        grace = first_deadline_grace_ms(self.leaf.amq) / 1000.0
        self._last_rx += max(0.0, grace - 2 * self.expect_every_ms / 1000.0) if self.expect_every_ms else 0.0
        self._writer = CoalescingWriter(stream.write)
        self._reader = threading.Thread(target=self._read_loop, name=f"amq-reader {self._name}", daemon=True)
        self._reader.start()
        if self.send_every_ms > 0:
            self._beater = threading.Thread(target=self._beat_loop, name=f"amq-heartbeat {self._name}", daemon=True)
            self._beater.start()
        log.debug("%s: connected to %s (dialect %s, STOMP %s, heart-beat send %d ms, expect %d ms)", self.address,
                  frame.get("server") or "a broker without a server header", self.dialect.name, self.version,
                  self.send_every_ms, self.expect_every_ms)
        return frame

    def _read_handshake(self, stream: NetworkStream, session: ClientSession, deadline: float) -> Negotiated:
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise ConnectError(f"{self.address}: no CONNECTED within the connect timeout")
            try:
                data = stream.read(65536, remaining)
            except ReadError as exc:  # reset by the peer: before any answer, a refusal
                raise session.closed(str(exc)) from exc
            except TransportError as exc:
                raise ConnectError(f"{self.address}: handshake failed: {exc}") from exc
            if data is None:
                continue
            terms = session.feed(data)
            if terms is not None:
                return terms

    # -- I/O ------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._stream is not None and not self._closing and not self._lost_reported

    @property
    def writer(self) -> CoalescingWriter | None:
        """The link's combining writer (None before ``open``); its ``flushes`` /
        ``writes`` counters show how much was coalesced."""
        return self._writer

    def write(self, frame: Frame) -> None:
        """Serialise and write one frame (any thread); returns once it is on the
        socket. Raises ``TransportError``."""
        writer = self._writer
        if writer is None or self._closing:
            raise ConnectionClosed(f"{self.address}: connection closed")
        writer.write(serialize(frame, self.version, text_mode=self.text_mode))
        self._last_tx = self._clock()

    def write_many(self, frames: list[Frame]) -> None:
        """Write several frames, contiguous and in order, in one socket write
        (replay after a reconnect, batched acks)."""
        writer = self._writer
        if writer is None or self._closing:
            raise ConnectionClosed(f"{self.address}: connection closed")
        if frames:
            version = self.version
            text_mode = self.text_mode
            writer.write(b"".join([serialize(f, version, text_mode=text_mode) for f in frames]))
            self._last_tx = self._clock()

    def _read_loop(self) -> None:
        stream = self._stream
        assert stream is not None
        error: TransportError | None = None
        try:
            self._drain()
            while not self._closing:
                timeout: float | None = None
                if self.expect_every_ms > 0:
                    deadline = self._last_rx + 2 * self.expect_every_ms / 1000.0
                    timeout = deadline - self._clock()
                    if timeout <= 0:
                        raise HeartbeatTimeout(
                            f"{self.address}: no data from the broker for {2 * self.expect_every_ms} ms "
                            f"(2 heart-beat intervals): connection is half-open"
                        )
                data = stream.read(65536, timeout)
                if data is None:
                    continue
                if data == b"":
                    raise ConnectionClosed(f"{self.address}: connection closed by the broker")
                self._last_rx = self._clock()
                self._parser.feed(data)
                self._drain()
        except TransportError as exc:
            error = exc
        except RemoteProtocolError as exc:
            error = ReadError(f"{self.address}: protocol error from the broker: {exc}")
            error.__cause__ = exc
        except Exception as exc:  # a bug: still report the link as lost
            log.exception("%s: reader thread crashed", self.address)
            error = ReadError(f"{self.address}: reader crashed: {exc!r}")
        finally:
            self._stop.set()
            if not self._closing:
                self._report_lost(error or ConnectionClosed(f"{self.address}: reader stopped"))

    def _drain(self) -> None:
        while True:
            event = self._parser.next_event()
            if event is NEED_DATA:
                return
            if isinstance(event, Frame) and self._on_frame is not None:
                try:
                    self._on_frame(self, event)
                except Exception:
                    log.exception("%s: frame handler failed on %s", self.address, event.command)

    def _report_lost(self, error: TransportError) -> None:
        with self._lost_lock:
            if self._lost_reported:
                return
            self._lost_reported = True
        if self._stream is not None:
            self._stream.close()
        log.info("%s: connection lost: %s", self.address, error)
        if self._on_lost is not None:
            try:
                self._on_lost(self, error)
            except Exception:
                log.exception("%s: on_lost handler failed", self.address)

    def _beat_loop(self) -> None:
        interval = self.send_every_ms / 1000.0
        while not self._stop.wait(interval / 2):
            writer = self._writer
            if self._closing or writer is None:
                return
            if self._clock() - self._last_tx >= interval * 0.8:
                try:
                    # queued behind a write in flight rather than waiting for it (that
                    # write's caller then sets _last_tx)
                    writer.write(HEARTBEAT_BYTES, wait=False)
                    self._last_tx = self._clock()
                except TransportError:
                    return  # the reader reports the loss

    def kill(self, error: TransportError) -> None:
        """Declare the link lost (from outside the reader, e.g. a failed write), reporting
        ``error`` once. The reader gets :data:`KILL_GRACE` seconds to end by itself
        first: a peer that closed after an ERROR has usually sent it, and closing the
        stream under the reader would lose it."""
        if not self._lost_reported:
            self.wait_reader(KILL_GRACE)
        self._report_lost(error)

    def wait_reader(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the reader thread to end (it delivers what
        the broker sent before closing); True when it has ended."""
        reader = self._reader
        if reader is None or reader is threading.current_thread():
            return reader is None
        if not reader.is_alive():  # ended; or made by open() and not started yet (it ends as it starts: closed)
            return reader.ident is not None
        reader.join(timeout)
        return not reader.is_alive()

    def end_with_error(self, frame: Frame) -> None:
        """The broker sent an ERROR that answers no request we can name: the link is
        over (STOMP: the broker closes the connection after an ERROR; RabbitMQ keeps
        some open, and a request it refused that way would otherwise wait forever).
        ``error_frame`` keeps the frame for whoever handles the loss."""
        if self.error_frame is None:
            self.error_frame = frame
        self._report_lost(ConnectionClosed(f"{self.address}: broker ERROR: {error_from_frame(frame)}"))

    def close(self, *, disconnect: bool = True, wait_receipt: float = 0.0) -> None:
        """Close locally (no ``on_lost``). Sends DISCONNECT first when asked. From
        another thread while ``open()`` runs: that open fails (a ``TransportError``)."""
        if self._closing:
            return
        writer = self._writer
        if disconnect and writer is not None and not self._lost_reported:
            try:
                headers = {"receipt": "disconnect"} if wait_receipt > 0 else {}
                writer.write(serialize(Frame.make("DISCONNECT", headers), self.version))
            except TransportError:
                pass
        self._closing = True
        stream = self._stream  # read after _closing is set: an open() still connecting sees one or the other
        self._stop.set()
        if stream is not None:
            stream.close()
        self.wait_reader(5.0)  # (a close from another thread may land as open() starts the reader)


class DirectTransport(Transport):
    """One endpoint, no reconnect: a lost link fails every pending request."""

    def __init__(self, leaf: LeafUri, params: ConnectParams, *, backend: Backend, clock: Clock = time.monotonic) -> None:
        super().__init__()
        self.leaf = leaf
        self._params = params
        self._backend = backend
        self._clock = clock
        self._conn: StompConnection | None = None
        self._error: AmqTransportError | None = None
        self._last_error_frame: Frame | None = None

    def start(self) -> None:
        conn = StompConnection(self.leaf, backend=self._backend, params=self._params, clock=self._clock,
                               on_frame=lambda c, f: self._dispatch(f, 1, c), on_lost=self._lost)
        conn.open()
        with self._lock:
            self._conn = conn
            self._generation = 1

    @property
    def link(self) -> StompConnection | None:
        return self._conn

    @property
    def connected_address(self) -> str | None:
        conn = self._conn
        return conn.address if conn is not None and conn.alive else None

    @property
    def is_connected(self) -> bool:
        conn = self._conn
        return conn is not None and conn.alive and self._error is None

    @property
    def version(self) -> str:
        return self._conn.version if self._conn is not None else "1.2"

    def _on_unmatched_error(self, frame: Frame) -> None:
        self._last_error_frame = frame

    def _lost(self, conn: StompConnection, error: TransportError) -> None:
        err: AmqTransportError = error
        if self._last_error_frame is not None:
            err = error_from_frame(self._last_error_frame)
        with self._lock:
            self._error = err
            pending = list(self._pending.values())
            self._pending.clear()
        for rec in pending:
            rec.set_error(err)
        self._notify("on_failed", err)

    def _live(self) -> StompConnection:
        if self._error is not None:
            raise self._error
        if self._closed or self._conn is None:
            raise ConnectionClosed("connection is closed")
        return self._conn

    def request(self, frame: Frame, *, receipt: bool = True) -> Receipt | None:
        conn = self._live()
        if not receipt:
            conn.write(frame)
            return None
        rid = self.next_id("r")
        rec = Receipt(rid, frame, tx=frame.get("transaction"))
        with self._lock:
            self._pending[rid] = rec
        try:
            conn.write(with_receipt(frame, rid))
        except TransportError:
            with self._lock:
                self._pending.pop(rid, None)
            raise
        return rec

    def wait(self, receipt: Receipt, timeout: float | None = None) -> Frame:
        if not receipt.wait_event(timeout):
            with self._lock:  # given up on: no longer waited for
                self._pending.pop(receipt.receipt_id, None)
            raise send_timeout(f"no receipt for {receipt.receipt_id} within {timeout}s", receipt)
        if receipt.error is not None:
            raise receipt.error
        assert receipt.result is not None
        return receipt.result

    def write_if_current(self, frame: Frame, generation: int) -> bool:
        self._live().write(frame)
        return True

    def write_many_if_current(self, frames: list[Frame], generation: int) -> bool:
        self._live().write_many(frames)
        return True

    def subscribe(self, sub_id: str, frame: Frame) -> Receipt:
        rec = self.request(frame, receipt=True)
        assert rec is not None
        return rec

    def unsubscribe(self, sub_id: str, frame: Frame) -> Receipt | None:
        return self.request(frame, receipt=True)

    def begin(self, tx_id: str) -> Receipt:
        rec = self.request(Frame.make("BEGIN", {"transaction": tx_id}))
        assert rec is not None
        return rec

    def commit(self, tx_id: str) -> Receipt:
        rec = self.request(Frame.make("COMMIT", {"transaction": tx_id}))
        assert rec is not None
        return rec

    def abort(self, tx_id: str) -> None:
        try:
            self.request(Frame.make("ABORT", {"transaction": tx_id}), receipt=False)
        except TransportError:
            pass

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._pending.values())
            self._pending.clear()
        conn = self._conn
        if conn is not None:
            conn.close()
        for rec in pending:
            rec.set_error(ConnectionClosed("connection closed locally"))
