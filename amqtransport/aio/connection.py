"""The asyncio client API: ``aio.connect(uri)`` -> :class:`AsyncConnection`.

Theory of operation
-------------------
An :class:`AsyncConnection` owns one
:class:`~amqtransport.aio.failover.AsyncFailoverTransport`, the asyncio driver of the
same sans-IO failover core as the thread client (a plain ``tcp://`` leaf is a failover
over that one endpoint that never reconnects, as in the sync client). Everything runs
on the caller's event loop; many tasks may share one connection.

The frames are built by :mod:`amqtransport.outbound` and the receive rules (duplicate
filter, ACK/NACK on the link a message came on) are :mod:`amqtransport.received`'s
:class:`~amqtransport.received.Inbound`: the sync client uses the same two modules, so
both clients send the same frames and keep the same promises.

*Cancellation.* A request is queued on the link whole, with no ``await`` between its
first and last byte, so a cancelled ``send`` was written whole or not at all. A send
with a receipt that was cancelled after it was written stays in the failover core
until the broker answers it (and is replayed on a new link with its idempotency key),
exactly as an unanswered send of a caller who stopped waiting. ``asyncio.timeout()``
works around any call.

*Receiving.* Messages arrive on the link's reader task and are queued on their
:class:`AsyncSubscription`; ``async for`` ends when the subscription or the
connection closes, and raises the failover's error if the connection failed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Generator, Iterable, Mapping
from types import TracebackType

from amqtransport.aio.failover import AsyncFailoverTransport
from amqtransport.audit import Delivery
from amqtransport.connection_info import ConnectionInfo
from amqtransport.errors import (
    AmqTransportError,
    ConnectionClosed,
    LocalProtocolError,
    ReconnectExhausted,
)
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
from amqtransport.transports.link import ConnectParams
from amqtransport.uri import LeafUri, parse_uri
from amqtransport.wire_tap import WireTapped

__all__ = ["AsyncConnection", "AsyncMessage", "AsyncProducer", "AsyncSubscription", "AsyncTransaction", "connect"]

log = logging.getLogger(__name__)


class _Closed:
    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class AsyncMessage(ReceivedMessage):
    """A received message (``body``, ``text``, ``headers``, ...); ``await msg.ack()``
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
        """Reject: the broker redelivers (or dead-letters) it (cumulative with
        ``ack="client"``, as in the sync client)."""
        if self.ack_mode == "auto":
            raise LocalProtocolError("nack() needs ack='client' or 'client-individual'")
        self._conn._inbound.ack(self, "NACK")


class AsyncSubscription:
    """Messages of one SUBSCRIBE; survives failovers (replayed with the same id).
    ``async for msg in sub`` or ``await sub.receive(timeout)``."""

    def __init__(self, conn: AsyncConnection, sub_id: str, destination: str, ack_mode: str,
                 durable_name: str | None) -> None:
        self._conn = conn
        self.id = sub_id
        self.destination = destination
        self.ack_mode = ack_mode
        self.durable_name = durable_name
        self._queue: asyncio.Queue[AsyncMessage | _Closed] = asyncio.Queue()
        self.active = True

    async def receive(self, timeout: float | None = None) -> AsyncMessage | None:
        """The next message, or None after ``timeout`` seconds (or once unsubscribed or
        the connection closed). Raises the failover's error if the connection failed."""
        if timeout is not None and timeout <= 0 and self._queue.empty():
            return None
        try:
            async with asyncio.timeout(timeout):
                item = await self._queue.get()
        except TimeoutError:
            return None
        if isinstance(item, _Closed):
            self._queue.put_nowait(item)  # every later receive sees it too
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
        return self._queue.qsize()

    async def ack_many(self, messages: Iterable[AsyncMessage]) -> None:
        """Acknowledge each of ``messages`` (received on this subscription), one ACK
        per message, one write per link. See :meth:`AsyncConnection.ack_many`."""
        batch = list(messages)
        for msg in batch:
            if msg._sub is not self:
                raise ValueError(f"ack_many: {msg!r} was received on subscription {msg._sub.id!r}, not {self.id!r}")
        await self._conn.ack_many(batch)

    async def unsubscribe(self, durable: bool = False) -> None:
        """Stop receiving (``durable=True``: also delete the durable subscription)."""
        if durable and self.durable_name is None:
            raise ValueError(f"subscription {self.id!r} to {self.destination} is not durable")
        if not self.active:
            if durable:
                await self._conn._delete_durable(self)
            return
        self.active = False
        await self._conn._unsubscribe(self, durable=durable)
        self._queue.put_nowait(_Closed(None))

    def _close(self, error: BaseException | None) -> None:
        self._queue.put_nowait(_Closed(error))

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.unsubscribe()
        except AmqTransportError:
            pass


class AsyncProducer:
    """Pipelined receipted sends: ``await p.send(...)`` waits only while ``window``
    receipts are outstanding; leaving ``async with`` waits for every receipt.
    A producer belongs to one task."""

    def __init__(self, conn: AsyncConnection, window: int = 100) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self._conn = conn
        self.window = window
        self._outstanding: deque[Receipt] = deque()
        self.sent = 0
        self.receipted = 0

    async def send(self, destination: str, body: bytes | str, headers: Mapping[str, str] | None = None, *,
                   persistent: bool = True, idempotency_key: str | None = None) -> None:
        frame = self._conn._send_frame(destination, body, headers, persistent, idempotency_key)
        while len(self._outstanding) >= self.window:
            await self._reap(None)
        rec = await self._conn._transport.request(frame)
        assert rec is not None
        self._outstanding.append(rec)
        self.sent += 1
        while self._outstanding and self._outstanding[0].done:
            await self._reap(None)

    async def _reap(self, timeout: float | None) -> None:
        """Wait for the oldest receipt. Its error is raised once (the request is done
        with); a cancelled wait leaves it outstanding."""
        try:
            await self._conn._transport.wait(self._outstanding[0], timeout)
        except asyncio.CancelledError:
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
        """Wait for every outstanding receipt (raises the first error)."""
        while self._outstanding:
            await self._reap(timeout)

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if exc_type is None:
            await self.flush()


class AsyncTransaction:
    """``async with conn.transaction() as tx: await tx.send(...); await tx.ack(m)``:
    commit on exit, abort on an exception. The rules are the sync client's
    (:class:`amqtransport.client.Transaction`): a failover while it is open makes it
    raise ``TransactionRolledBack``, a COMMIT in doubt raises ``TransactionInDoubt``
    with the keys of its sends."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn
        self.id = conn._transport.next_id("tx")
        self._open = False
        self._sends: list[Receipt] = []
        self._acks: list[AsyncMessage] = []
        self._after_commit: list[AsyncMessage] = []

    async def __aenter__(self) -> AsyncTransaction:
        t = self._conn._transport
        await t.wait(await t.begin(self.id))
        self._open = True
        return self

    async def send(self, destination: str, body: bytes | str, headers: Mapping[str, str] | None = None, *,
                   persistent: bool = True, idempotency_key: str | None = None) -> None:
        if not self._open:
            raise LocalProtocolError("transaction is not open")
        frame = self._conn._send_frame(destination, body, headers, persistent, idempotency_key)
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

    async def commit(self) -> None:
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
        try:
            await t.wait(await t.commit(self.id))
            committed = True
            for rec in self._sends:
                await t.wait(rec)
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
        self._conn._inbound.forget_acks(self._acks)  # the broker redelivers them

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
    """A connection through a URI on the running event loop. Use :func:`connect`."""

    def __init__(self, transport: AsyncFailoverTransport, *, dedupe: bool = True,
                 audit_size: int = DEFAULT_AUDIT_SIZE, uri: str = "", client_id: str | None = None) -> None:
        self.uri = uri
        self._client_id = client_id
        self._transport = transport
        self._inbound = Inbound(transport, dedupe=dedupe, audit_size=audit_size)
        self._subs: dict[str, AsyncSubscription] = {}
        self._closed = False
        transport.on_message = self._on_message
        transport.add_listener(_FailedListener(self))

    @property
    def transport(self) -> AsyncFailoverTransport:
        return self._transport

    def _status(self) -> AsyncFailoverTransport:
        return self._transport

    def add_listener(self, listener: object) -> None:
        """Listener with optional ``on_interrupted(error)``, ``on_resumed(address)``,
        ``on_failed(error)``, each a plain or an ``async`` callable."""
        self._transport.add_listener(listener)

    # -- sending ----------------------------------------------------------------------
    def _send_frame(self, destination: str, body: bytes | str, headers: Mapping[str, str] | None,
                    persistent: bool, idempotency_key: str | None) -> Frame:
        if self._closed:
            raise ConnectionClosed("connection is closed")
        t = self._transport
        return send_frame(destination, body, headers, persistent, idempotency_key, dialect=t.dialect,
                          duplicate_id_header=t.duplicate_id_header)

    async def send(self, destination: str, body: bytes | str, headers: Mapping[str, str] | None = None, *,
                   persistent: bool = True, idempotency_key: str | None = None, receipt: bool = True) -> None:
        """Send one message; returns once the broker's receipt is in (``receipt=False``:
        once written; replayed after a failover only with ``trackMessages=true``)."""
        frame = self._send_frame(destination, body, headers, persistent, idempotency_key)
        rec = await self._transport.request(frame, receipt=receipt)
        if rec is not None:
            await self._transport.wait(rec)

    def producer(self, window: int = 100) -> AsyncProducer:
        return AsyncProducer(self, window)

    def transaction(self) -> AsyncTransaction:
        return AsyncTransaction(self)

    # -- receiving ----------------------------------------------------------------------
    async def subscribe(self, destination: str, *, ack: AckMode = "auto", headers: Mapping[str, str] | None = None,
                        prefetch: int | None = None, durable_name: str | None = None,
                        selector: str | None = None) -> AsyncSubscription:
        """Subscribe to ``destination`` (the arguments are the sync client's)."""
        if self._closed:
            raise ConnectionClosed("connection is closed")
        t = self._transport
        frame = subscribe_frame(destination, ack, headers, prefetch, durable_name, dialect=t.dialect,
                                client_id=self._client_id, next_id=t.next_id, in_use=self._subs, selector=selector)
        sub_id = frame.get("id") or ""
        sub = AsyncSubscription(self, sub_id, destination, ack, durable_name)
        self._subs[sub_id] = sub
        try:
            await t.wait(await t.subscribe(sub_id, frame))
        except BaseException:
            self._subs.pop(sub_id, None)
            raise
        return sub

    async def _unsubscribe(self, sub: AsyncSubscription, *, durable: bool) -> None:
        self._subs.pop(sub.id, None)
        self._inbound.forget(sub.id)
        t = self._transport
        for frame in unsubscribe_frames(sub.id, sub.durable_name, durable, dialect=t.dialect,
                                        client_id=self._client_id):
            rec = await t.unsubscribe(sub.id, frame)
            if rec is not None:
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

    def _on_message(self, frame: Frame, generation: int) -> None:
        self._tap_wire(frame, generation)
        sub_id = frame.get("subscription") or ""
        sub = self._subs.get(sub_id)
        if sub is None:
            log.debug("message for unknown subscription %r dropped", sub_id)
            return
        got = self._inbound.arrived(sub_id, sub.ack_mode, frame, generation)
        if got is not None:
            sub._queue.put_nowait(AsyncMessage(frame, self, sub, generation, *got))

    async def ack_many(self, messages: Iterable[AsyncMessage]) -> None:
        """``await msg.ack()`` for each, with the frames of one link in one write."""
        self._inbound.ack_many(messages)

    def _on_failed(self, error: BaseException) -> None:
        for sub in list(self._subs.values()):
            sub._close(error)

    # -- lifecycle ------------------------------------------------------------------------
    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._transport.close()
        finally:
            for sub in list(self._subs.values()):
                sub._close(None)

    async def __aenter__(self) -> AsyncConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncConnection({self.uri!r}, connected_uri={self.connected_uri!r})"


class _Connecting:
    """What :func:`connect` returns: ``await`` it for the connection, or use it in
    ``async with`` (the connection closes on exit)."""

    def __init__(self, uri: str, params: ConnectParams, dedupe: bool, audit_size: int,
                 listener: object) -> None:
        self._uri = uri
        self._params = params
        self._dedupe = dedupe
        self._audit_size = audit_size
        self._listener = listener
        self._conn: AsyncConnection | None = None

    async def _open(self) -> AsyncConnection:
        transport = AsyncFailoverTransport.from_uri(self._uri, self._params)
        conn = AsyncConnection(transport, dedupe=self._dedupe, audit_size=self._audit_size, uri=self._uri,
                               client_id=self._params.client_id)
        if self._listener is not None:
            transport.add_listener(self._listener)
        try:
            await transport.start()
        except ReconnectExhausted as exc:
            await transport.close()
            if isinstance(parse_uri(self._uri), LeafUri) and isinstance(exc.last_error, AmqTransportError):
                # one broker, no reconnect: the connect error itself, as the sync client raises it
                raise exc.last_error from exc
            raise
        except BaseException:
            await transport.close()
            raise
        return conn

    def __await__(self) -> Generator[object, None, AsyncConnection]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncConnection:
        self._conn = await self._open()
        return self._conn

    async def __aexit__(self, *exc: object) -> None:
        if self._conn is not None:
            await self._conn.close()


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
) -> _Connecting:
    """Connect through ``uri`` (the sync client's grammar and options: docs/uris.md):
    ``async with aio.connect(uri) as conn:`` or ``conn = await aio.connect(uri)``."""
    params = ConnectParams(login=login, passcode=passcode, vhost=vhost, client_id=client_id,
                           heartbeat=(int(heartbeat[0]), int(heartbeat[1])), connect_timeout=connect_timeout)
    return _Connecting(uri, params, dedupe, audit_size, listener)
