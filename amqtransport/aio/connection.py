"""The client API: a connection, its subscriptions, producers, transactions and
messages.

Written once for both clients: the source is ``amqtransport/aio/connection.py``, the
asyncio client, whose classes carry an ``Async`` prefix; ``scripts/async_to_sync.py``
generates the sync client from it (``amqtransport/_sync/connection.py``, re-exported by
``amqtransport.client``) by dropping ``async``, ``await`` and the prefix, through the
script's tables. What the two do differently is in the flavour seams
``amqtransport/aio/flavour.py`` and ``amqtransport/_sync/flavour.py``: a subscription's
inbox, the exception of an abandoned wait, the transport type. Opening a connection is
each client's own (``aio/connecting.py``, ``client.py``). Edit the source, never the
generated file, then run ``python scripts/async_to_sync.py`` (``make lint`` and
tests/test_generated.py fail while the generated file is stale).

Theory of operation
-------------------
A connection owns one transport built from the URI. The asyncio client runs
:class:`~amqtransport.aio.failover.AsyncFailoverTransport`, the asyncio driver of the
sans-IO failover core, for every URI (a plain ``tcp://`` leaf is a failover over that
one endpoint that never reconnects); the sync client runs the thread driver
(``transports/failover.py``) or, for a plain ``tcp://`` leaf, a ``DirectTransport``.

Every SEND carries an idempotency key (:mod:`amqtransport.outbound` builds the frames:
the caller's key or 128 fresh random bits) and asks for a receipt, so the failover layer can
replay it after a reconnect and a broker that honours the key drops the copy. ``send``
returns once the receipt is in; a producer keeps up to ``window`` receipts
outstanding, and raises a refused send's error once.

Messages arrive on the transport's reader (the link's protocol callbacks in asyncio, a
thread in the sync client), pass the duplicate filter and the ack rules of
:class:`~amqtransport.received.Inbound` (a redelivered copy of a message the
application already has is dropped; an ACK goes only on the link its message came on)
and are queued on their subscription's inbox; iterating a subscription ends when it or
the connection closes, and raises the failover's error if the connection failed.

*Timeouts.* Every call that waits for the broker takes ``timeout=`` (seconds; None:
as long as the URI's ``timeout`` option allows, by default for ever): ``send``,
``subscribe``, a producer's ``send`` (waiting for room in its window) and ``flush``,
``transaction()`` (its BEGIN, and its commit on exit) and ``commit``. A receipt not in
by then raises ``SendTimeout`` naming the idempotency key of the send it waited for
(send it again with that key); the request is no longer replayed. A subscription whose
SUBSCRIBE timed out is withdrawn (an UNSUBSCRIBE follows); a commit that timed out
raises ``TransactionInDoubt`` with the keys of its sends, as a COMMIT in doubt does.

Transactions wait for a receipt on every frame but their sends; a failover while one
is open makes its next send or its commit raise ``TransactionRolledBack`` (never a
silent partial commit), and a COMMIT in doubt raises ``TransactionInDoubt`` with the
keys of its sends.

*Threads (sync client).* A connection may be shared by threads (``send``,
``subscribe`` and ``transaction`` are thread-safe); a producer or a transaction belongs
to one thread. Listeners are called on the transport's threads.

*Cancellation (asyncio client).* Everything runs on the caller's event loop; many
tasks may share one connection. A request is queued on the link whole, with no
suspension point between its first and last byte, so a cancelled ``send`` was written
whole or not at all. A send with a receipt that was cancelled after it was written
stays in the failover core until the broker answers it (and is replayed on a new link
with its idempotency key), exactly as an unanswered send of a caller who stopped
waiting. ``asyncio.timeout()`` works around any call; listeners may be plain or
``async`` callables.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from types import TracebackType

from amqtransport.aio.flavour import Driver, Inbox, Interrupted
from amqtransport.aio.requests import AsyncRequester, browse_queue, remaining
from amqtransport.audit import Delivery
from amqtransport.connection_info import ConnectionInfo
from amqtransport.errors import AmqTransportError, ConnectionClosed, LocalProtocolError, SendTimeout
from amqtransport.outbound import (
    DEFAULT_AUDIT_SIZE,
    AckMode,
    commit_failure,
    send_frame,
    subscribe_frame,
    unsubscribe_frames,
)
from amqtransport.received import Inbound, ReceivedMessage
from amqtransport.stomp import Frame
from amqtransport.transports.base import Receipt
from amqtransport.wire_tap import WireTapped

__all__ = ["AsyncConnection", "AsyncMessage", "AsyncProducer", "AsyncSubscription", "AsyncTransaction"]

log = logging.getLogger(__name__)


class _Closed:
    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class AsyncMessage(ReceivedMessage):
    """A received message (``body``, ``text``, ``headers``, ...). ``await msg.ack()``
    and ``await msg.nack()`` matter in the client ack modes."""

    __slots__ = ("_conn", "_sub")

    def __init__(self, frame: Frame, conn: AsyncConnection, sub: AsyncSubscription, generation: int, key: str,
                 delivery: Delivery | None) -> None:
        super().__init__(frame, sub.id, sub.ack_mode, generation, key, delivery)
        self._conn = conn
        self._sub = sub

    async def ack(self) -> None:
        """Acknowledge (no-op with ``ack="auto"``)."""
        if self.ack_mode != "auto":
            self._conn._inbound.ack(self, "ACK")

    async def nack(self) -> None:
        """Reject: the broker redelivers (or dead-letters) it; the duplicate filter
        forgets it so the redelivery reaches the application. With ``ack="client"`` a
        NACK is cumulative, like an ACK: it also rejects every earlier unacknowledged
        message of the subscription (acking one of those afterwards raises)."""
        if self.ack_mode == "auto":
            raise LocalProtocolError("nack() needs ack='client' or 'client-individual'")
        self._conn._inbound.ack(self, "NACK")


class AsyncSubscription:
    """Messages of one SUBSCRIBE; survives failovers (replayed with the same id).
    ``async for msg in sub`` or ``await sub.receive(timeout)``."""

    def __init__(self, conn: AsyncConnection, sub_id: str, destination: str, ack_mode: str,
                 durable_name: str | None = None) -> None:
        self._conn = conn
        self.id = sub_id
        self.destination = destination
        self.ack_mode = ack_mode
        #: the name of a durable topic subscription (``subscribe(..., durable_name=...)``)
        self.durable_name = durable_name
        self._inbox: Inbox[AsyncMessage | _Closed] = Inbox()
        self.active = True

    async def receive(self, timeout: float | None = None) -> AsyncMessage | None:
        """The next message, or None after ``timeout`` seconds (or once unsubscribed /
        the connection closed). Raises the transport's error if the connection failed
        (e.g. ``ReconnectExhausted``)."""
        item = await self._inbox.get(timeout)
        if isinstance(item, _Closed):
            self._inbox.put(item)  # every later receive sees it too
            if item.error is not None:
                raise item.error
            return None
        return item

    def __aiter__(self) -> AsyncIterator[AsyncMessage]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[AsyncMessage]:
        while True:
            msg = await self.receive()
            if msg is None:
                return
            yield msg

    def pending(self) -> int:
        return self._inbox.qsize()

    async def ack_many(self, messages: Iterable[AsyncMessage]) -> None:
        """Acknowledge each of ``messages`` (received on this subscription), one ACK
        per message, one write per link. See :meth:`AsyncConnection.ack_many`."""
        batch = list(messages)
        for msg in batch:
            if msg._sub is not self:
                raise ValueError(f"ack_many: {msg!r} was received on subscription {msg._sub.id!r}, not {self.id!r}")
        await self._conn.ack_many(batch)

    async def unsubscribe(self, durable: bool = False) -> None:
        """Stop receiving. A durable subscription survives this (and the connection's
        close) and keeps collecting messages on the broker; ``durable=True`` deletes it
        (with its messages), on the broker's own terms (each dialect's headers)."""
        if durable and self.durable_name is None:
            raise ValueError(f"subscription {self.id!r} to {self.destination} is not durable "
                             "(subscribe(..., durable_name=...))")
        if not self.active:
            if durable:
                await self._conn._delete_durable(self)
            return
        self.active = False
        await self._conn._unsubscribe(self, durable=durable)
        self._inbox.put(_Closed(None))

    def _close(self, error: BaseException | None) -> None:
        self._inbox.put(_Closed(error))

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.unsubscribe()
        except AmqTransportError:
            pass


class AsyncProducer:
    """Pipelined receipted sends: ``await p.send(...)`` waits only while ``window``
    receipts are outstanding; ``await p.flush()`` waits for all; leaving the
    ``async with`` block flushes. A producer belongs to one thread (sync client) or one
    task (asyncio client); its connection may be shared."""

    def __init__(self, conn: AsyncConnection, window: int = 100) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self._conn = conn
        self.window = window
        self._outstanding: deque[Receipt] = deque()
        self.sent = 0
        self.receipted = 0

    async def send(self, destination: str, body: bytes | str, headers: Mapping[str, str] | None = None, *,
                   persistent: bool = True, idempotency_key: str | None = None,
                   timeout: float | None = None, priority: int | None = None, delay: int | None = None) -> None:
        """Send one message once the window has room: ``timeout`` bounds the wait for the
        oldest receipt (``SendTimeout`` names that send's key; this one is not sent).
        ``priority``, ``delay``: as :meth:`AsyncConnection.send`."""
        frame = self._conn._send_frame(destination, body, headers, persistent, idempotency_key, priority, delay)
        while len(self._outstanding) >= self.window:
            await self._reap(timeout)
        rec = await self._conn._transport.request(frame)
        assert rec is not None
        self._outstanding.append(rec)
        self.sent += 1
        # reap what is already done without blocking
        while self._outstanding and self._outstanding[0].done:
            await self._reap(None)

    async def _reap(self, timeout: float | None) -> None:
        """Wait for the oldest receipt. Its error is raised once (the request is done
        with); an abandoned wait (``Interrupted``) leaves it outstanding."""
        try:
            await self._conn._transport.wait(self._outstanding[0], timeout)
        except Interrupted:
            raise
        except BaseException:
            self._outstanding.popleft()
            raise
        self._outstanding.popleft()
        self.receipted += 1

    @property
    def outstanding(self) -> int:
        return len(self._outstanding)

    async def flush(self, timeout: float | None = None) -> None:
        """Wait for every outstanding receipt (raises the first error; ``timeout``: in
        all, then ``SendTimeout`` naming the key of the send still waited for)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._outstanding:
            await self._reap(remaining(deadline))

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if exc_type is None:
            await self.flush()


class AsyncTransaction:
    """``async with conn.transaction() as tx: await tx.send(...); await tx.ack(msg)``
    -- commit on exit, abort on an exception.

    A transactional SEND is not waited for when it is made (RabbitMQ answers it only
    after the COMMIT, as it publishes then): :meth:`commit` waits for the COMMIT's
    receipt, then for every send's. A send the broker refused makes the commit raise
    its error. :meth:`ack` acknowledges a received message as part of the transaction
    (on Artemis, which ignores ACKs inside a transaction, it is acknowledged right after
    the COMMIT instead). A failover while it is open makes it raise
    ``TransactionRolledBack``; a link lost while the COMMIT is in flight raises
    :class:`~amqtransport.errors.TransactionInDoubt` with the keys of the sends."""

    def __init__(self, conn: AsyncConnection, timeout: float | None = None) -> None:
        self._conn = conn
        #: how long the BEGIN and the commit on exit wait for the broker (seconds)
        self.timeout = timeout
        self.id = conn._transport.next_id("tx")
        self._open = False
        self._sends: list[Receipt] = []
        self._acks: list[AsyncMessage] = []
        self._after_commit: list[AsyncMessage] = []  # acks the broker would ignore inside the transaction

    async def __aenter__(self) -> AsyncTransaction:
        t = self._conn._transport
        try:
            await t.wait(await t.begin(self.id), self.timeout)
        except BaseException:
            self._rollback()
            raise
        self._open = True
        return self

    async def send(self, destination: str, body: bytes | str, headers: Mapping[str, str] | None = None, *,
                   persistent: bool = True, idempotency_key: str | None = None,
                   priority: int | None = None, delay: int | None = None) -> None:
        if not self._open:
            raise LocalProtocolError("transaction is not open")
        frame = self._conn._send_frame(destination, body, headers, persistent, idempotency_key, priority, delay)
        rec = await self._conn._transport.request(frame.with_headers(transaction=self.id))
        assert rec is not None
        self._sends.append(rec)
        if rec.done and rec.error is not None:
            raise rec.error

    async def ack(self, msg: AsyncMessage) -> None:
        """Acknowledge ``msg`` when (and only if) the transaction commits."""
        if not self._open:
            raise LocalProtocolError("transaction is not open")
        if msg.ack_mode == "auto":
            return
        if self._conn._transport.dialect.tx_acks_ignored:
            self._after_commit.append(msg)
            return
        self._conn._inbound.tx_ack(msg, self.id)
        self._acks.append(msg)

    async def commit(self, timeout: float | None = None) -> None:
        """Commit: returns once the COMMIT's receipt and every send's are in (``timeout``:
        in all, default the transaction's; then ``TransactionInDoubt``)."""
        if not self._open:
            return
        self._open = False
        inbound, t = self._conn._inbound, self._conn._transport
        failed = next((r for r in self._sends if r.done and r.error is not None), None)
        if failed is not None:
            self._rollback()
            assert failed.error is not None
            raise failed.error
        committed = False
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            await t.wait(await t.commit(self.id), timeout)
            committed = True
            for rec in self._sends:  # already in (ActiveMQ, ours), or following the COMMIT's (RabbitMQ)
                await t.wait(rec, remaining(deadline))
        except BaseException as exc:
            inbound.forget_acks(self._acks + self._after_commit)
            mapped = commit_failure(exc, self.id, [r.frame for r in self._sends], committed=committed)
            if mapped is not None:
                raise mapped from exc
            raise
        finally:
            t.tx_done(self.id)
        inbound.tx_acked(self._acks)
        if self._after_commit:
            inbound.ack_many(self._after_commit)

    async def abort(self) -> None:
        if self._open:
            self._open = False
            self._rollback()

    def _rollback(self) -> None:
        t = self._conn._transport
        t.abort(self.id)
        t.tx_done(self.id)
        # the broker redelivers what this transaction acked: let those copies through
        self._conn._inbound.forget_acks(self._acks)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if exc_type is None:
            await self.commit()
        else:
            await self.abort()


class _FailedListener:
    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    def on_failed(self, error: BaseException) -> None:
        self._conn._on_failed(error)


class AsyncConnection(ConnectionInfo, WireTapped):
    """A connection through a URI. Use ``connect``."""

    def __init__(self, transport: Driver, *, dedupe: bool = True, audit_size: int = DEFAULT_AUDIT_SIZE,
                 uri: str = "", client_id: str | None = None) -> None:
        self.uri = uri
        self._client_id = client_id
        self._transport = transport
        self._inbound = Inbound(transport, dedupe=dedupe, audit_size=audit_size)
        self._subs: dict[str, AsyncSubscription] = {}
        self._closed = False
        self._requests: AsyncRequester[AsyncMessage] = AsyncRequester(self)
        transport.on_message = self._on_message
        transport.add_listener(_FailedListener(self))

    # -- info -----------------------------------------------------------------------------
    @property
    def transport(self) -> Driver:
        return self._transport

    @property
    def closed(self) -> bool:
        return self._closed

    def _status(self) -> Driver:
        return self._transport

    def add_listener(self, listener: object) -> None:
        """Listener with optional ``on_interrupted(error)``, ``on_resumed(address)``,
        ``on_failed(error)`` (see the module docstring for where they are called);
        exceptions are logged."""
        self._transport.add_listener(listener)

    # -- sending ----------------------------------------------------------------------------
    def _send_frame(self, destination: str, body: bytes | str, headers: Mapping[str, str] | None,
                    persistent: bool, idempotency_key: str | None, priority: int | None = None,
                    delay: int | None = None) -> Frame:
        if self._closed:
            raise ConnectionClosed("connection is closed")
        t = self._transport
        return send_frame(destination, body, headers, persistent, idempotency_key, dialect=t.dialect,
                          duplicate_id_header=t.duplicate_id_header, priority=priority, delay=delay)

    async def send(self, destination: str, body: bytes | str, headers: Mapping[str, str] | None = None, *,
                   persistent: bool = True, idempotency_key: str | None = None, receipt: bool = True,
                   timeout: float | None = None, priority: int | None = None, delay: int | None = None) -> None:
        """Send one message; returns once the broker's receipt is in (``receipt=False``:
        once written — replayed after a failover only with ``trackMessages=true``).
        ``timeout``: seconds to wait for the receipt, then ``SendTimeout`` with the key.
        ``priority``: 0-9, the JMS priority (``priority`` header; higher is delivered first).
        ``delay``: milliseconds the broker holds the message before delivering it
        (``AMQ_SCHEDULED_DELAY``: ActiveMQ with its scheduler on, and our broker)."""
        frame = self._send_frame(destination, body, headers, persistent, idempotency_key, priority, delay)
        rec = await self._transport.request(frame, receipt=receipt)
        if rec is not None:
            await self._transport.wait(rec, timeout)

    def producer(self, window: int = 100) -> AsyncProducer:
        return AsyncProducer(self, window)

    def transaction(self, *, timeout: float | None = None) -> AsyncTransaction:
        """A transaction; ``timeout`` bounds its BEGIN and its commit (seconds)."""
        return AsyncTransaction(self, timeout)

    # -- receiving ---------------------------------------------------------------------------
    async def subscribe(self, destination: str, *, ack: AckMode = "auto", headers: Mapping[str, str] | None = None,
                        prefetch: int | None = None, durable_name: str | None = None,
                        selector: str | None = None, timeout: float | None = None) -> AsyncSubscription:
        """Subscribe to ``destination``. ``prefetch``: at most that many unacknowledged
        messages in flight (each broker's header; RabbitMQ counts it per connection and
        gets :data:`~amqtransport.outbound.DEFAULT_PREFETCH` when none is given, as it
        has no limit of its own). ``durable_name``: a durable topic subscription of that
        name, which keeps collecting messages while nobody is subscribed (and after
        ``close()``), until ``unsubscribe(durable=True)``; ActiveMQ, Artemis and our
        broker file it under the connection's ``connect(..., client_id=...)``.
        ``selector``: a JMS message selector (``"color = 'red' AND price > 10"``): only
        matching messages are delivered (ActiveMQ and our broker; a bad one raises the
        broker's ERROR as a ``BrokerError``).
        ``timeout``: seconds to wait for the broker's receipt, then ``SendTimeout`` (the
        subscription is withdrawn)."""
        if self._closed:
            raise ConnectionClosed("connection is closed")
        t = self._transport
        frame = subscribe_frame(destination, ack, headers, prefetch, durable_name, dialect=t.dialect,
                                client_id=self._client_id, next_id=t.next_id, in_use=self._subs, selector=selector)
        sub_id = frame.get("id") or ""
        sub = AsyncSubscription(self, sub_id, destination, ack, durable_name)
        self._subs[sub_id] = sub
        try:
            await t.wait(await t.subscribe(sub_id, frame), timeout)
        except SendTimeout:
            await self._unsubscribe(sub, durable=False, wait=False)  # not replayed, not left on the broker
            raise
        except BaseException:
            self._subs.pop(sub_id, None)
            raise
        return sub

    async def _unsubscribe(self, sub: AsyncSubscription, *, durable: bool = False, wait: bool = True) -> None:
        self._subs.pop(sub.id, None)
        self._inbound.forget(sub.id)
        t = self._transport
        for frame in unsubscribe_frames(sub.id, sub.durable_name, durable, dialect=t.dialect,
                                        client_id=self._client_id):
            rec = await t.unsubscribe(sub.id, frame)
            if rec is not None and wait:
                await t.wait(rec)

    async def _delete_durable(self, sub: AsyncSubscription) -> None:
        """Delete a durable subscription nobody is subscribed to on this connection
        (RabbitMQ deletes one only from a live subscription: subscribe, then delete)."""
        assert sub.durable_name is not None
        t = self._transport
        if t.dialect.name == "rabbitmq":
            again = await self.subscribe(sub.destination, ack=sub.ack_mode,  # type: ignore[arg-type]
                                         durable_name=sub.durable_name)
            await again.unsubscribe(durable=True)
            return
        frame = Frame.make("UNSUBSCRIBE", {
            "id": sub.id, **t.dialect.durable_unsubscribe_headers(sub.durable_name, self._client_id)})
        rec = await t.unsubscribe(sub.id, frame)
        if rec is not None:
            await t.wait(rec)

    # -- request/reply and browsing (requests.py) --------------------------------------------
    async def request(self, destination: str, body: bytes | str, headers: Mapping[str, str] | None = None, *,
                      timeout: float | None = None, persistent: bool = False) -> AsyncMessage:
        """Send a request and return its reply: the message carries ``reply-to`` (this
        connection's temporary reply queue) and a ``correlation-id`` (fresh, or the one
        in ``headers``); the reply is the first message on the reply queue with that
        ``correlation-id``, and the only one (a second is dropped). ``timeout``: seconds
        for all of it, then :class:`~amqtransport.errors.RequestTimeout`. Across a
        failover: answered once, or ``RequestTimeout`` (docs/client.md)."""
        return await self._requests.request(destination, body, headers, timeout=timeout, persistent=persistent)

    def browse(self, destination: str, *, selector: str | None = None,
               timeout: float | None = 30.0) -> AsyncIterator[AsyncMessage]:
        """The messages queue ``destination`` holds now, in order, nothing consumed
        (``browser:true``; ActiveMQ and our broker): ``async for msg in conn.browse(q)``.
        Ends at the broker's ``browser:end``; ``selector``: only matching ones;
        ``timeout``: seconds to wait for each message, then ``RequestTimeout``."""
        return browse_queue(self, destination, selector, timeout)

    def _on_message(self, frame: Frame, generation: int) -> None:
        self._tap_wire(frame, generation)
        sub_id = frame.get("subscription") or ""
        sub = self._subs.get(sub_id)
        if sub is None:
            log.debug("message for unknown subscription %r dropped", sub_id)
            return
        got = self._inbound.arrived(sub_id, sub.ack_mode, frame, generation)
        if got is not None:
            msg = AsyncMessage(frame, self, sub, generation, *got)
            if sub is self._requests.replies:
                self._requests.arrived(msg)  # to the request waiting for it
            else:
                sub._inbox.put(msg)

    async def ack_many(self, messages: Iterable[AsyncMessage]) -> None:
        """Acknowledge several messages at once: the same as ``await msg.ack()`` for
        each, in order (one ACK per message id, so ``client-individual`` semantics
        hold), but the frames of one link go out in a single socket write. Messages of
        ``ack="auto"`` subscriptions are skipped. A message delivered on a link that
        has since failed is handled as ``ack()`` handles it (the broker redelivers it;
        the duplicate filter acks the copy)."""
        self._inbound.ack_many(messages)

    def _on_failed(self, error: BaseException) -> None:
        self._requests.fail(error)
        for sub in list(self._subs.values()):
            sub._close(error)

    # -- lifecycle -------------------------------------------------------------------------
    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._transport.close()
        finally:
            self._requests.fail(ConnectionClosed("connection closed while the request waited for its reply"))
            for sub in list(self._subs.values()):
                sub._close(None)

    async def __aenter__(self) -> AsyncConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncConnection({self.uri!r}, connected_uri={self.connected_uri!r})"
