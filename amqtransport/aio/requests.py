"""Request/reply over a temporary queue, and queue browsing: ``conn.request()`` and
``conn.browse()`` of both clients.

Written once, for asyncio, like ``aio/connection.py``: ``scripts/async_to_sync.py``
generates ``amqtransport/_sync/requests.py`` from it (edit this file, then run the
script).

Theory of operation
-------------------
*Request/reply.* A connection makes one reply queue, on its first request: a
subscription to ``/temp-queue/amq.replies.<random>``, a temporary queue of the
connection (the broker names it ``/remote-temp-queue/ID:...`` to everyone else and
rewrites the ``reply-to`` header to that name). Each request carries
``reply-to`` and a fresh ``correlation-id`` (the caller's, when its headers give one)
and registers a one-slot inbox under that id *before* it is sent; the reply
subscription does not queue what it receives: :meth:`AsyncRequester.arrived` hands
each reply to the inbox its ``correlation-id`` names and forgets the id, so a request
is answered once. A reply nobody waits for (a second reply, a reply after the caller
gave up) is dropped and counted (``late``). No reply within ``timeout`` raises
:class:`~amqtransport.errors.RequestTimeout`; the connection failing raises the
failover's error (``ReconnectExhausted``), and ``close()`` ``ConnectionClosed``.

*Across a failover* the connection is a new one on the broker, so its temporary queue
is a new one too: the failover layer replays the reply subscription on the new link,
and the broker creates ``/temp-queue/amq.replies.<random>`` afresh, under a new remote
name; the old one was deleted with the old connection. What holds then:

- a request whose SEND is replayed on the new link (it had no receipt yet) carries
  ``reply-to:/temp-queue/...`` again, which the new broker rewrites to the new remote
  name: its reply arrives;
- a request the old broker had accepted names the old remote name: a reply to it is
  refused by the broker (``does not exist``; the replier gets a ``BrokerError``) or was
  delivered before the link died. The caller gets that one reply, or ``RequestTimeout``
  at its ``timeout``;
- a request served twice (redelivered to the replier after the failover) is still
  answered once: the second reply finds no inbox and is dropped.

*Browsing* (:func:`browse_queue`) subscribes with ``browser:true`` (ActiveMQ's and our
broker's queue browser): the broker sends what the queue holds, then a MESSAGE with
``browser:end``; nothing is consumed. The iterator yields each message, ends at the
marker and then unsubscribes. Other brokers would consume the messages: it is refused
on them. A failover during a browse replays the subscription: the new broker's browse
starts again, and the duplicate filter drops what was already yielded.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Generic, Protocol, TypeVar

from amqtransport.aio.flavour import Inbox, Lock
from amqtransport.errors import ConnectionClosed, LocalProtocolError, RequestTimeout, SendTimeout
from amqtransport.received import ReceivedMessage

__all__ = ["BROWSING_DIALECTS", "REPLY_PREFIX", "AsyncRequester", "browse_queue", "remaining"]

log = logging.getLogger(__name__)

#: the name of a connection's reply queue (a temporary queue) starts so
REPLY_PREFIX = "/temp-queue/amq.replies."
#: the brokers whose ``browser:true`` browses (elsewhere a browser would consume)
BROWSING_DIALECTS = ("amq", "activemq")


M = TypeVar("M", bound=ReceivedMessage)
M_co = TypeVar("M_co", bound=ReceivedMessage, covariant=True)


class _Subscription(Protocol[M_co]):
    """What this module uses of a subscription (``AsyncSubscription``; the connection
    module imports this one, not the other way round)."""

    @property
    def destination(self) -> str: ...

    @property
    def active(self) -> bool: ...

    async def receive(self, timeout: float | None = None) -> M_co | None: ...

    async def unsubscribe(self, durable: bool = False) -> None: ...


class _Connection(Protocol[M_co]):
    """What this module uses of a connection (``AsyncConnection``)."""

    @property
    def dialect(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    async def send(self, destination: str, body: bytes | str, headers: Mapping[str, str] | None = None, *,
                   persistent: bool = True, timeout: float | None = None) -> None: ...

    async def subscribe(self, destination: str, *, headers: Mapping[str, str] | None = None,
                        selector: str | None = None, timeout: float | None = None) -> _Subscription[M_co]: ...


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (a ``time.monotonic()``; None: no deadline)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class AsyncRequester(Generic[M]):
    """One connection's requests: its reply queue and who waits for which reply. The
    connection hands every message of :attr:`replies` to :meth:`arrived`."""

    def __init__(self, conn: _Connection[M]) -> None:
        self._conn = conn
        self._lock = Lock()
        #: the reply queue's subscription (None until the first request)
        self.replies: _Subscription[M] | None = None
        self._waiting: dict[str, Inbox[M | _Failed]] = {}
        #: replies that came when nobody waited for them (dropped)
        self.late = 0

    async def _reply_queue(self, timeout: float | None) -> _Subscription[M]:
        async with self._lock:
            if self.replies is None:
                self.replies = await self._conn.subscribe(REPLY_PREFIX + uuid.uuid4().hex[:16], timeout=timeout)
            return self.replies

    async def request(self, destination: str, body: bytes | str, headers: Mapping[str, str] | None, *,
                      timeout: float | None, persistent: bool) -> M:
        """See :meth:`AsyncConnection.request`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        replies = await self._reply_queue(timeout)
        hdrs = dict(headers or {})
        cid = hdrs.get("correlation-id") or uuid.uuid4().hex
        if cid in self._waiting:
            raise LocalProtocolError(f"a request with correlation-id {cid!r} is already waiting for its reply")
        hdrs.update({"reply-to": replies.destination, "correlation-id": cid})
        inbox: Inbox[M | _Failed] = Inbox()
        self._waiting[cid] = inbox  # before the send: a reply may overtake the receipt
        try:
            try:
                await self._conn.send(destination, body, hdrs, persistent=persistent, timeout=timeout)
            except SendTimeout as exc:
                raise RequestTimeout(f"request {cid} to {destination}: not even sent within {timeout} s "
                                     f"({exc})", correlation_id=cid, destination=destination) from exc
            item = await inbox.get(remaining(deadline))
        finally:
            self._waiting.pop(cid, None)
        if item is None:
            raise RequestTimeout(f"request {cid} to {destination}: no reply within {timeout} s",
                                 correlation_id=cid, destination=destination)
        if isinstance(item, _Failed):
            raise item.error
        return item

    def arrived(self, msg: M) -> None:
        """A message on the reply queue (the transport calls it): to the one who waits."""
        cid = msg.headers.get("correlation-id") or ""
        inbox = self._waiting.pop(cid, None)
        if inbox is None:
            self.late += 1
            log.info("reply with correlation-id %r dropped: no request waits for it (answered already, "
                     "or given up)", cid)
            return
        inbox.put(msg)

    def fail(self, error: BaseException) -> None:
        """The connection failed or closed: every waiting request raises ``error``."""
        for cid in list(self._waiting):
            inbox = self._waiting.pop(cid, None)
            if inbox is not None:
                inbox.put(_Failed(error))


async def browse_queue(conn: _Connection[M], destination: str, selector: str | None,
                       timeout: float | None) -> AsyncIterator[M]:
    """See :meth:`AsyncConnection.browse`."""
    dialect = conn.dialect
    if dialect not in BROWSING_DIALECTS:
        raise LocalProtocolError(f"browse needs ActiveMQ or the amq broker (browser:true); on {dialect} "
                                 "a browser would consume the messages")
    sub = await conn.subscribe(destination, headers={"browser": "true"}, selector=selector, timeout=timeout)
    try:
        while True:
            msg = await sub.receive(timeout)
            if msg is None:
                if conn.closed:
                    raise ConnectionClosed(f"connection closed while browsing {destination}")
                raise RequestTimeout(f"browse of {destination}: nothing from the broker for {timeout} s "
                                     "(no browser:end)", destination=destination)
            if msg.headers.get("browser") == "end":
                return
            yield msg
    finally:
        if sub.active and not conn.closed:
            await sub.unsubscribe()
