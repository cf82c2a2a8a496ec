"""The public client API: ``connect(uri)`` -> :class:`Connection`.

Theory of operation
-------------------
A :class:`Connection` owns one transport built from the URI (``transports.factory``):
a :class:`~amqtransport.transports.link.DirectTransport` for a plain ``tcp://``
leaf, a :class:`~amqtransport.transports.failover.FailoverTransport` for
``failover:``/``static:``/``masterslave:``. Every SEND carries an idempotency key
(``amq-idempotency-key``; the caller's or a fresh UUID) and asks for a receipt, so
the failover layer can replay it after a reconnect and a broker that honours the key
(ours) drops the copy. :meth:`Connection.send` returns once the receipt is in;
:class:`Producer` keeps up to ``window`` receipts outstanding for throughput.

Messages arrive on the transport's reader thread, pass the **duplicate filter**
(:mod:`amqtransport.audit`: ActiveMQ's "message audit", a bounded LRU of
``(subscription, key)`` where the key is the idempotency key, else the message-id) and
are queued on their :class:`Subscription`. A redelivery of a message the application
already has is dropped; in the client-acknowledged modes the filter also says when
such a dropped copy may be acknowledged (after its original, and in ``client`` mode
never by an ACK that would cover an unacknowledged message).

Transactions (:meth:`Connection.transaction`) wait for a receipt on every frame; a
failover while one is open makes its next send or its commit raise
``TransactionRolledBack`` (never a silent partial commit).
"""

from __future__ import annotations

import logging
import queue
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType

from amqtransport._backends.base import Backend
from amqtransport.audit import Delivery
from amqtransport.connection_info import ConnectionInfo
from amqtransport.errors import AmqTransportError, ConnectionClosed, LocalProtocolError
from amqtransport.outbound import (
    DEFAULT_AUDIT_SIZE,
    DEFAULT_PREFETCH,
    AckMode,
    commit_failure,
    send_frame,
    subscribe_frame,
    unsubscribe_frames,
)
from amqtransport.received import Inbound, ReceivedMessage
from amqtransport.stomp import Frame
from amqtransport.transports.base import Receipt, Transport
from amqtransport.transports.factory import build_transport
from amqtransport.transports.link import ConnectParams
from amqtransport.wire_tap import WireTapped

__all__ = ["connect", "Connection", "Producer", "Subscription", "Message", "Transaction", "AckMode",
           "DEFAULT_AUDIT_SIZE", "DEFAULT_PREFETCH"]

log = logging.getLogger(__name__)


class _Closed:
    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class Message(ReceivedMessage):
    """A received message (``body``, ``text``, ``headers``, ...). ``ack()``/``nack()``
    matter in the client ack modes."""

    __slots__ = ("_conn", "_sub")

    def __init__(self, frame: Frame, conn: Connection, sub: Subscription, generation: int, key: str,
                 delivery: Delivery | None) -> None:
        super().__init__(frame, sub.id, sub.ack_mode, generation, key, delivery)
        self._conn = conn
        self._sub = sub

    def ack(self) -> None:
        """Acknowledge (no-op with ``ack="auto"``)."""
        if self._sub.ack_mode == "auto":
            return
        self._conn._inbound.ack(self, "ACK")

    def nack(self) -> None:
        """Reject: the broker redelivers (or dead-letters) it; the duplicate filter
        forgets it so the redelivery reaches the application. With ``ack="client"`` a
        NACK is cumulative, like an ACK: it also rejects every earlier unacknowledged
        message of the subscription (acking one of those afterwards raises)."""
        if self._sub.ack_mode == "auto":
            raise LocalProtocolError("nack() needs ack='client' or 'client-individual'")
        self._conn._inbound.ack(self, "NACK")


class Subscription:
    """Messages of one SUBSCRIBE; survives failovers (replayed with the same id)."""

    def __init__(self, conn: Connection, sub_id: str, destination: str, ack_mode: str,
                 durable_name: str | None = None) -> None:
        self._conn = conn
        self.id = sub_id
        self.destination = destination
        self.ack_mode = ack_mode
        #: the name of a durable topic subscription (``subscribe(..., durable_name=...)``)
        self.durable_name = durable_name
        self._queue: queue.Queue[Message | _Closed] = queue.Queue()
        self.active = True

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds (or once unsubscribed /
        the connection closed). Raises the transport's error if the connection failed
        (e.g. ``ReconnectExhausted``)."""
        try:
            item = self._queue.get(timeout=timeout) if timeout is None or timeout > 0 else self._queue.get_nowait()
        except queue.Empty:
            return None
        if isinstance(item, _Closed):
            self._queue.put(item)  # every later receive sees it too
            if item.error is not None:
                raise item.error
            return None
        return item

    def __iter__(self) -> Iterator[Message]:
        while True:
            msg = self.receive()
            if msg is None:
                return
            yield msg

    def pending(self) -> int:
        return self._queue.qsize()

    def ack_many(self, messages: Iterable[Message]) -> None:
        """Acknowledge every message of ``messages`` (received on this subscription)
        with one ACK frame each, all written in one socket write. See
        :meth:`Connection.ack_many`."""
        batch = list(messages)
        for msg in batch:
            if msg._sub is not self:
                raise ValueError(f"ack_many: {msg!r} was received on subscription {msg._sub.id!r}, not {self.id!r}")
        self._conn.ack_many(batch)

    def unsubscribe(self, durable: bool = False) -> None:
        """Stop receiving. A durable subscription survives this (and the connection's
        close) and keeps collecting messages on the broker; ``durable=True`` deletes it
        (with its messages), on the broker's own terms (each dialect's headers)."""
        if durable and self.durable_name is None:
            raise ValueError(f"subscription {self.id!r} to {self.destination} is not durable "
                             "(subscribe(..., durable_name=...))")
        if not self.active:
            if durable:
                self._conn._delete_durable(self)
            return
        self.active = False
        self._conn._unsubscribe(self, durable=durable)
        self._queue.put(_Closed(None))

    def _close(self, error: BaseException | None) -> None:
        self._queue.put(_Closed(error))

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.unsubscribe()
        except AmqTransportError:
            pass


class Producer:
    """Pipelined receipted sends: ``send`` blocks only while ``window`` receipts are
    outstanding; ``flush`` waits for all; leaving the ``with`` block flushes.

    A producer belongs to one thread (use one per thread); the :class:`Connection`
    itself may be shared: ``send``/``subscribe``/``transaction`` are thread-safe."""

    def __init__(self, conn: Connection, window: int = 100) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self._conn = conn
        self.window = window
        self._outstanding: deque[Receipt] = deque()
        self.sent = 0
        self.receipted = 0

    def send(self, destination: str, body: bytes | str, headers: Mapping[str, str] | None = None, *,
             persistent: bool = True, idempotency_key: str | None = None) -> None:
        frame = self._conn._send_frame(destination, body, headers, persistent, idempotency_key)
        while len(self._outstanding) >= self.window:
            self._reap(None)
        rec = self._conn._transport.request(frame)
        assert rec is not None
        self._outstanding.append(rec)
        self.sent += 1
        # reap what is already done without blocking
        while self._outstanding and self._outstanding[0].done:
            self._reap(None)

    def _reap(self, timeout: float | None) -> None:
        """Wait for the oldest receipt. Its error is raised once (the request is done
        with); an interrupted wait (KeyboardInterrupt) leaves it outstanding."""
        try:
            self._conn._transport.wait(self._outstanding[0], timeout)
        except KeyboardInterrupt:
            raise
        except BaseException:
            self._outstanding.popleft()
            raise
        self._outstanding.popleft()
        self.receipted += 1

    @property
    def outstanding(self) -> int:
        return len(self._outstanding)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every outstanding receipt (raises the first error)."""
        while self._outstanding:
            self._reap(timeout)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.flush()


class Transaction:
    """``with conn.transaction() as tx: tx.send(...); tx.ack(msg)`` -- commit on exit,
    abort on an exception.

    A transactional SEND is not waited for when it is made (RabbitMQ answers it only
    after the COMMIT, as it publishes then): :meth:`commit` waits for the COMMIT's
    receipt, then for every send's. A send the broker refused makes the commit raise
    its error. :meth:`ack` acknowledges a received message as part of the transaction
    (on Artemis, which ignores ACKs inside a transaction, it is acknowledged right after
    the COMMIT instead). A link lost while the COMMIT is in flight raises
    :class:`~amqtransport.errors.TransactionInDoubt` with the keys of the sends."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.id = conn._transport.next_id("tx")
        self._open = False
        self._sends: list[Receipt] = []
        self._acks: list[Message] = []
        self._after_commit: list[Message] = []  # acks the broker would ignore inside the transaction

    def __enter__(self) -> Transaction:
        t = self._conn._transport
        t.wait(t.begin(self.id))
        self._open = True
        return self

    def send(self, destination: str, body: bytes | str, headers: Mapping[str, str] | None = None, *,
             persistent: bool = True, idempotency_key: str | None = None) -> None:
        if not self._open:
            raise LocalProtocolError("transaction is not open")
        frame = self._conn._send_frame(destination, body, headers, persistent, idempotency_key)
        frame = frame.with_headers(transaction=self.id)
        rec = self._conn._transport.request(frame)
        assert rec is not None
        self._sends.append(rec)
        if rec.done and rec.error is not None:
            raise rec.error

    def ack(self, msg: Message) -> None:
        """Acknowledge ``msg`` when (and only if) the transaction commits."""
        if not self._open:
            raise LocalProtocolError("transaction is not open")
        if msg._sub.ack_mode == "auto":
            return
        if self._conn._transport.dialect.tx_acks_ignored:
            self._after_commit.append(msg)
            return
        self._conn._inbound.tx_ack(msg, self.id)
        self._acks.append(msg)

    def commit(self) -> None:
        if not self._open:
            return
        self._open = False
        conn, t = self._conn, self._conn._transport
        failed = next((r for r in self._sends if r.done and r.error is not None), None)
        if failed is not None:
            self._rollback()
            assert failed.error is not None
            raise failed.error
        committed = False
        try:
            t.wait(t.commit(self.id))
            committed = True
            for rec in self._sends:  # already in (ActiveMQ, ours), or following the COMMIT's (RabbitMQ)
                t.wait(rec)
        except BaseException as exc:
            conn._inbound.forget_acks(self._acks + self._after_commit)
            mapped = commit_failure(exc, self.id, [r.frame for r in self._sends], committed=committed)
            if mapped is not None:
                raise mapped from exc
            raise
        finally:
            t.tx_done(self.id)
        conn._inbound.tx_acked(self._acks)
        if self._after_commit:
            conn.ack_many(self._after_commit)

    def abort(self) -> None:
        if not self._open:
            return
        self._open = False
        self._rollback()

    def _rollback(self) -> None:
        self._conn._transport.abort(self.id)
        self._conn._transport.tx_done(self.id)
        # the broker redelivers what this transaction acked: let those copies through
        self._conn._inbound.forget_acks(self._acks)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


class _InternalListener:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def on_failed(self, error: BaseException) -> None:
        self._conn._on_failed(error)


class Connection(ConnectionInfo, WireTapped):
    """A connection through a URI. Use :func:`connect`."""

    def __init__(self, transport: Transport, *, dedupe: bool = True, audit_size: int = DEFAULT_AUDIT_SIZE,
                 uri: str = "", client_id: str | None = None) -> None:
        self.uri = uri
        self._client_id = client_id
        self._transport = transport
        self._inbound = Inbound(transport, dedupe=dedupe, audit_size=audit_size)
        self._subs: dict[str, Subscription] = {}
        self._closed = False
        transport.on_message = self._on_message
        transport.add_listener(_InternalListener(self))

    # -- info -----------------------------------------------------------------------------
    @property
    def transport(self) -> Transport:
        return self._transport

    def _status(self) -> Transport:
        return self._transport

    def add_listener(self, listener: object) -> None:
        """Listener with optional ``on_interrupted(error)``, ``on_resumed(address)``,
        ``on_failed(error)``; called from the transport's threads, exceptions logged."""
        self._transport.add_listener(listener)

    # -- sending ----------------------------------------------------------------------------
    def _send_frame(self, destination: str, body: bytes | str, headers: Mapping[str, str] | None,
                    persistent: bool, idempotency_key: str | None) -> Frame:
        if self._closed:
            raise ConnectionClosed("connection is closed")
        t = self._transport
        return send_frame(destination, body, headers, persistent, idempotency_key, dialect=t.dialect,
                          duplicate_id_header=t.duplicate_id_header)

    def send(self, destination: str, body: bytes | str, headers: Mapping[str, str] | None = None, *,
             persistent: bool = True, idempotency_key: str | None = None, receipt: bool = True) -> None:
        """Send one message; returns once the broker's receipt is in (``receipt=False``:
        once written — replayed after a failover only with ``trackMessages=true``)."""
        frame = self._send_frame(destination, body, headers, persistent, idempotency_key)
        rec = self._transport.request(frame, receipt=receipt)
        if rec is not None:
            self._transport.wait(rec)

    def producer(self, window: int = 100) -> Producer:
        return Producer(self, window)

    def transaction(self) -> Transaction:
        return Transaction(self)

    # -- receiving ---------------------------------------------------------------------------
    def subscribe(self, destination: str, *, ack: AckMode = "auto", headers: Mapping[str, str] | None = None,
                  prefetch: int | None = None, durable_name: str | None = None,
                  selector: str | None = None) -> Subscription:
        """Subscribe to ``destination``. ``prefetch``: at most that many unacknowledged
        messages in flight (each broker's header; RabbitMQ counts it per connection and
        gets :data:`DEFAULT_PREFETCH` when none is given, as it has no limit of its own).
        ``durable_name``: a durable topic subscription of that name, which keeps
        collecting messages while nobody is subscribed (and after ``close()``), until
        ``unsubscribe(durable=True)``; ActiveMQ, Artemis and our broker file it under the
        connection's ``connect(..., client_id=...)``. ``selector``: a JMS message selector
        (``"color = 'red' AND price > 10"``): only matching messages are delivered (ActiveMQ
        and our broker; a bad one raises the broker's ERROR as a ``BrokerError``)."""
        if self._closed:
            raise ConnectionClosed("connection is closed")
        frame = subscribe_frame(destination, ack, headers, prefetch, durable_name, dialect=self._transport.dialect,
                                client_id=self._client_id, next_id=self._transport.next_id, in_use=self._subs,
                                selector=selector)
        sub_id = frame.get("id") or ""
        sub = Subscription(self, sub_id, destination, ack, durable_name)
        self._subs[sub_id] = sub
        try:
            self._transport.wait(self._transport.subscribe(sub_id, frame))
        except BaseException:
            self._subs.pop(sub_id, None)
            raise
        return sub

    def _unsubscribe(self, sub: Subscription, *, durable: bool = False) -> None:
        self._subs.pop(sub.id, None)
        self._inbound.forget(sub.id)
        t = self._transport
        frames = unsubscribe_frames(sub.id, sub.durable_name, durable, dialect=t.dialect, client_id=self._client_id)
        for frame in frames:
            rec = t.unsubscribe(sub.id, frame)
            if rec is not None:
                t.wait(rec)

    def _delete_durable(self, sub: Subscription) -> None:
        """Delete a durable subscription nobody is subscribed to on this connection
        (RabbitMQ deletes one only from a live subscription: subscribe, then delete)."""
        assert sub.durable_name is not None
        if self._transport.dialect.name == "rabbitmq":
            again = self.subscribe(sub.destination, ack=sub.ack_mode, durable_name=sub.durable_name)  # type: ignore[arg-type]
            again.unsubscribe(durable=True)
            return
        rec = self._transport.unsubscribe(sub.id, Frame.make("UNSUBSCRIBE", {
            "id": sub.id, **self._transport.dialect.durable_unsubscribe_headers(sub.durable_name, self._client_id)}))
        if rec is not None:
            self._transport.wait(rec)

    def _on_message(self, frame: Frame, generation: int) -> None:
        self._tap_wire(frame, generation)
        sub_id = frame.get("subscription") or ""
        sub = self._subs.get(sub_id)
        if sub is None:
            log.debug("message for unknown subscription %r dropped", sub_id)
            return
        got = self._inbound.arrived(sub_id, sub.ack_mode, frame, generation)
        if got is not None:
            sub._queue.put(Message(frame, self, sub, generation, *got))

    def ack_many(self, messages: Iterable[Message]) -> None:
        """Acknowledge several messages at once: the same as ``msg.ack()`` for each,
        in order (one ACK per message id, so ``client-individual`` semantics hold),
        but the frames of one link go out in a single socket write. Messages of
        ``ack="auto"`` subscriptions are skipped. A message delivered on a link that
        has since failed is handled as ``ack()`` handles it (the broker redelivers it;
        the duplicate filter acks the copy)."""
        self._inbound.ack_many(messages)

    def _on_failed(self, error: BaseException) -> None:
        for sub in list(self._subs.values()):
            sub._close(error)

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._transport.close()
        finally:
            for sub in list(self._subs.values()):
                sub._close(None)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Connection({self.uri!r}, connected_uri={self.connected_uri!r})"


def connect(
    uri: str,
    *,
    login: str | None = None,
    passcode: str | None = None,
    vhost: str | None = None,
    client_id: str | None = None,
    heartbeat: tuple[int, int] = (10000, 10000),
    dedupe: bool = True,
    listener: object = None,
    connect_timeout: float | None = None,
    audit_size: int = DEFAULT_AUDIT_SIZE,
    backend: Backend | None = None,
    sleep: Callable[[float], object] | None = None,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> Connection:
    """Connect through ``uri`` (the grammar: docs/uris.md) and return a
    :class:`Connection`. ``connect_timeout`` is in seconds (default: the leaf's
    ``connectTimeout`` option, 10 s). ``backend``/``sleep``/``clock``/``rng`` are
    injection points for tests."""
    params = ConnectParams(login=login, passcode=passcode, vhost=vhost, client_id=client_id,
                           heartbeat=(int(heartbeat[0]), int(heartbeat[1])), connect_timeout=connect_timeout)
    transport = build_transport(uri, params, backend=backend, sleep=sleep, clock=clock, rng=rng)
    conn = Connection(transport, dedupe=dedupe, audit_size=audit_size, uri=uri, client_id=client_id)
    if listener is not None:
        transport.add_listener(listener)
    transport.start()
    return conn
