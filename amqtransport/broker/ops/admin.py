"""Operator actions on a serving broker: browse, send, purge, move/retry, delete, close.

Theory of operation
-------------------
:class:`BrokerAdmin` is the interface the HTTP console and API call; :class:`ServerAdmin`
implements it for a :class:`~.server.BrokerServer` (a plain broker, or an HA master:
the HA view hands one out only while its node is master). Everything runs on the
broker's event loop, like a client's frames, and goes through the core's and the
store's public operations, so an action is journalled -- and in a replicated pair
streamed to the slave -- exactly like the same change made by a client:

- *browse* reads the messages waiting in a queue (not those in a consumer's hands),
  headers and the first :data:`BODY_PREVIEW` bytes of the body; nothing changes;
- *purge* and *delete* take waiting messages off the queue (paged ones are read back a
  window at a time), release their memory and write one ``Ack`` record per
  :data:`CHUNK` messages;
- *move* takes waiting messages off the queue and puts each on its target with
  :meth:`~.core.Acks.move_message` (a journalled ``Move``, the one the core uses
  to dead-letter): to a queue the operator names, or, for a *retry*, back to the
  message's ``original-destination`` (a dead-letter queue's messages carry it); every
  message is checked to have a target before any moves -- in a queue with paged
  messages, a window at a time, so a message without one stops the move there;
- *send* is a SEND without a connection (no producer flow control: it is one message).

The coroutines return once what they wrote is durable -- fsynced, and in a replicated
pair on the slave's disk too -- so "moved 3 messages" means what a receipt means.
Long moves give the loop back every :data:`CHUNK` messages. A message that is in
flight to a consumer cannot be moved, purged or deleted: the consumer holds it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from amqtransport.destinations import QUEUE_PREFIX
from amqtransport.errors import ServerError

from ..dispatch.core import BrokerCore
from ..dispatch.errors import CoreError
from ..dispatch.message import TRANSPORT_HEADERS, Message
from ..dispatch.names import DURABLE_PREFIX, check_send_destination, destination_key
from ..dispatch.queues import Queue
from ..dispatch.selection import settle
from ..store import ORIGINAL_DESTINATION

if TYPE_CHECKING:
    from ..server import BrokerServer

__all__ = [
    "AdminError",
    "BODY_PREVIEW",
    "BrokerAdmin",
    "BrowsePage",
    "BrowsedMessage",
    "ConnectionStats",
    "MoveResult",
    "ServerAdmin",
]

log = logging.getLogger(__name__)

BODY_PREVIEW = 1024  # bytes of a body shown by browse
CHUNK = 1000  # messages per record / per loop turn in long actions
DURABLE_TIMEOUT = 30.0  # seconds an action waits for its records to be durable
MAX_BROWSE = 500


class AdminError(ServerError):
    """An action the broker refuses; ``status`` is the HTTP status that says why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class BrowsedMessage:
    id: str
    destination: str
    timestamp: float
    persistent: bool
    delivery_count: int
    expires: float
    size: int
    headers: tuple[tuple[str, str], ...]
    body: str  # the first BODY_PREVIEW bytes, decoded as UTF-8 (undecodable bytes replaced)
    truncated: bool
    binary: bool  # the preview is not valid UTF-8 text


@dataclass(frozen=True)
class BrowsePage:
    queue: str
    total: int  # messages waiting
    in_flight: int  # in consumers' hands (not listed)
    offset: int
    messages: tuple[BrowsedMessage, ...]


@dataclass(frozen=True)
class MoveResult:
    moved: int
    targets: tuple[str, ...]
    missing: tuple[str, ...]  # ids not waiting in the queue


@dataclass(frozen=True)
class ConnectionStats:
    """One client connection as the console lists it (``/api/connections``)."""

    id: str
    peer: str
    user: str | None
    client_id: str | None
    version: str
    connected: bool
    age: float  # seconds since the TCP connection was accepted
    subscriptions: tuple[str, ...]
    unacked: int
    transactions: int
    frames_in: int
    messages_out: int
    transport: str = "tcp"  # or "ws": the broker's WebSocket port


class BrokerAdmin(Protocol):
    """The operations the console offers (see the module docstring)."""

    def browse(self, queue: str, *, offset: int = 0, limit: int = 50) -> BrowsePage: ...

    async def send(self, destination: str, body: bytes, headers: Mapping[str, str], *,
                   persistent: bool) -> None: ...

    async def purge(self, queue: str) -> int: ...

    async def delete(self, queue: str, message_id: str) -> bool: ...

    async def move(self, queue: str, ids: Sequence[str] | None, to: str | None) -> MoveResult: ...

    def connections(self) -> list[ConnectionStats]: ...

    def close_connection(self, conn_id: str, reason: str) -> bool: ...


def _preview(msg: Message) -> BrowsedMessage:
    head = msg.body[:BODY_PREVIEW]
    try:
        text = head.decode("utf-8")
        binary = False
    except UnicodeDecodeError as exc:
        # a multi-byte character cut by the preview is still text
        binary = not (exc.start >= len(head) - 3 and len(msg.body) > BODY_PREVIEW)
        text = head.decode("utf-8", "replace")
    return BrowsedMessage(
        id=msg.id, destination=msg.destination, timestamp=msg.timestamp, persistent=msg.persistent,
        delivery_count=msg.delivery_count, expires=msg.expires, size=len(msg.body), headers=msg.headers,
        body=text, truncated=len(msg.body) > BODY_PREVIEW, binary=binary,
    )


class ServerAdmin:
    """:class:`BrokerAdmin` over a serving :class:`~.server.BrokerServer`."""

    def __init__(self, server: BrokerServer) -> None:
        self.server = server

    @property
    def core(self) -> BrokerCore:
        return self.server.core

    # ------------------------------------------------------------------ lookups
    def _queue(self, name: str) -> Queue:
        key = destination_key(name, list(self.core.queues))
        q = self.core.queues.get(key)
        if q is None:
            raise AdminError(f"no queue {name!r} on this broker", 404)
        return q

    def _target(self, to: str) -> str:
        to = to.strip()
        if not to:
            raise AdminError("empty target queue")
        if to.startswith(DURABLE_PREFIX) and to in self.core.durable_subs:
            return to
        key = to if to.startswith("/") else QUEUE_PREFIX + to
        try:
            kind, _name = check_send_destination(key)
        except CoreError as exc:
            raise AdminError(str(exc)) from None
        if kind != "queue":
            raise AdminError(f"messages can only be moved to a queue, not to {key!r}")
        return key

    def _retry_target(self, q: Queue, m: Message) -> str:
        for k, v in m.headers:
            if k == ORIGINAL_DESTINATION:
                return v
        prefix = QUEUE_PREFIX + self.core.config.dlq_prefix
        if q.name.startswith(prefix) and len(q.name) > len(prefix):
            return QUEUE_PREFIX + q.name[len(prefix):]
        raise AdminError(f"message {m.id} has no {ORIGINAL_DESTINATION} header: name a target queue")

    async def _durable(self) -> None:
        """Wait until everything written so far is durable (and replicated)."""
        store = self.server.store
        if store is None:
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[BaseException | None] = loop.create_future()

        def callback(err: BaseException | None) -> None:
            if not done.done():
                done.set_result(err)

        store.journal.on_durable(callback)
        try:
            err = await asyncio.wait_for(done, DURABLE_TIMEOUT)
        except TimeoutError:
            raise AdminError(f"applied, but not durable within {DURABLE_TIMEOUT:.0f} s", 504) from None
        if err is not None:
            raise AdminError(f"applied, but the journal failed: {err}", 500)

    def _take_all(self, q: Queue) -> Iterator[list[Message]]:
        """Every waiting message of ``q``, front to back, taken off the queue in batches
        (paged ones read back a window at a time)."""
        settle(q)
        first, q.messages = list(q.messages), deque()
        if first:
            yield first
        while batch := self.core.page_in(q):
            yield batch

    def _take_ids(self, q: Queue, ids: set[str]) -> list[Message]:
        """The waiting messages of ``q`` with these ids, taken off the queue, in queue order."""
        keep: deque[Message] = deque()
        taken: list[Message] = []
        settle(q)
        for m in q.messages:
            (taken if m.id in ids else keep).append(m)
        q.messages = keep
        missing = ids - {m.id for m in taken}
        store = self.server.store
        if missing and store is not None:
            paged = store.take_ids(q.name, missing)
            for m in paged:
                self.core.memory.charge(m)
            taken += paged
        return taken

    def _discard(self, msgs: Sequence[Message]) -> None:
        core = self.core
        for m in msgs:
            core.memory.release(m)
        ids = [m.id for m in msgs if m.persistent]
        for i in range(0, len(ids), CHUNK):
            core.store_ack(ids[i:i + CHUNK])

    # ------------------------------------------------------------------ BrokerAdmin
    def browse(self, queue: str, *, offset: int = 0, limit: int = 50) -> BrowsePage:
        if offset < 0 or not 1 <= limit <= MAX_BROWSE:
            raise AdminError(f"offset must be >= 0 and limit between 1 and {MAX_BROWSE}")
        q = self._queue(queue)
        in_flight = sum(1 for sub in q.consumers for m in sub.unacked.values() if m.destination == q.name)
        settle(q)
        msgs = q.messages
        shown = [msgs[i] for i in range(offset, min(len(msgs), offset + limit))]
        store = self.server.store
        if len(shown) < limit and store is not None:  # and the paged ones, read back
            shown += store.peek(q.name, max(0, offset - len(msgs)), limit - len(shown))
        page = [_preview(m) for m in shown]
        return BrowsePage(queue=q.name, total=q.depth, in_flight=in_flight, offset=offset, messages=tuple(page))

    async def send(self, destination: str, body: bytes, headers: Mapping[str, str], *, persistent: bool) -> None:
        dest = destination.strip()
        if not dest.startswith("/"):
            dest = QUEUE_PREFIX + dest
        clean: list[tuple[str, str]] = []
        key = ""
        for k, v in headers.items():
            if not k or any(c in k for c in ":\r\n") or any(c in v for c in "\r\n"):
                raise AdminError(f"bad header {k!r}: names must not be empty or hold ':' or line breaks")
            if k in TRANSPORT_HEADERS or k == "persistent":
                continue
            if k in ("amq-idempotency-key", "_AMQ_DUPL_ID") and not key:
                key = v
            clean.append((k, v))
        if persistent:
            clean.append(("persistent", "true"))
        try:
            self.core.send(dest, tuple(clean), body, persistent=persistent, key=key)
        except CoreError as exc:
            raise AdminError(str(exc)) from None
        await self._durable()

    async def purge(self, queue: str) -> int:
        q = self._queue(queue)
        n = 0
        for batch in self._take_all(q):
            self._discard(batch)
            n += len(batch)
            await asyncio.sleep(0)
        await self._durable()
        return n

    async def delete(self, queue: str, message_id: str) -> bool:
        q = self._queue(queue)
        taken = self._take_ids(q, {message_id})
        if not taken:
            raise AdminError(f"message {message_id!r} is not waiting in {q.name} (in flight to a consumer, "
                             "or gone)", 404)
        self._discard(taken)
        await self._durable()
        return True

    async def move(self, queue: str, ids: Sequence[str] | None, to: str | None) -> MoveResult:
        q = self._queue(queue)
        target = self._target(to) if to else None
        if target is not None and target == q.name:
            raise AdminError(f"{q.name} is the queue the messages are in")
        batches: Iterator[list[Message]]
        if ids is None:
            batches = self._take_all(q)
            missing: list[str] = []
        else:
            taken = self._take_ids(q, set(ids))
            found = {m.id for m in taken}
            missing = [i for i in ids if i not in found]
            batches = iter([taken])
        moved = 0
        targets: set[str] = set()
        for batch in batches:  # each batch checked whole before any of it moves
            plan: list[tuple[Message, str]] = []
            try:
                for m in batch:
                    dest = target or self._retry_target(q, m)
                    if dest == q.name:
                        raise AdminError(f"message {m.id} would go back to {q.name}, the queue it is in")
                    plan.append((m, dest))
            except AdminError:
                q.requeue(batch)  # not moved: put them back where they were
                raise
            for i, (m, dest) in enumerate(plan):
                self.core.acks.move_message(m, dest)
                targets.add(dest)
                if (i + 1) % CHUNK == 0:
                    await asyncio.sleep(0)
            moved += len(plan)
            await asyncio.sleep(0)
        await self._durable()
        return MoveResult(moved=moved, targets=tuple(sorted(targets)), missing=tuple(missing))

    def connections(self) -> list[ConnectionStats]:
        now = self.server.loop.time()
        out: list[ConnectionStats] = []
        for conn in self.server.connections:
            out.append(ConnectionStats(
                id=conn.session or conn.peer, peer=conn.peer, user=conn.login, client_id=conn.client_id,
                version=conn.version, connected=conn.connected, age=max(0.0, now - conn.opened_at),
                subscriptions=tuple(sorted(sub.destination for sub in conn.subs.values())),
                unacked=sum(len(sub.unacked) for sub in conn.subs.values()), transactions=len(conn.txs),
                frames_in=conn.frames_in, messages_out=conn.messages_out,
                transport="ws" if conn.over_websocket else "tcp",
            ))
        out.sort(key=lambda c: -c.age)
        return out

    def close_connection(self, conn_id: str, reason: str) -> bool:
        for conn in list(self.server.connections):
            if conn_id in (conn.session, conn.peer) and conn_id:
                conn.close_by_admin(reason)
                return True
        return False
