"""Selective consumers on a deep queue: looking at paged messages without taking them in.

Theory of operation
-------------------
A queue whose consumers all have selectors (and none is exclusive, has a priority or
owns a message group: consumers.py decides those, with resident messages) does not
page its paged messages in a window at a time to set the misses aside (selection.py);
it *scans* them where they are, in the store's page list (store/pages.py), in the
order a consumer would take them (front to back, or by priority):

1. If every consumer's selector names ``(header, value)`` pairs one of which a
   matching message must hold (:attr:`~amqtransport.selector.Selector.required`:
   ``k = 'hit'``, ``JMSType IN ('a', 'b')``, an AND with such a part), only the records
   holding one of their byte forms (:func:`~..store.records.header_needles`) are
   candidates: the store finds them by searching the segment's bytes around a batch of
   paged records at C speed; every other record is a miss, never read one by one,
   decoded, nor checked for expiry (it stays paged: a consumer that takes it later
   drops it then, if it has expired).
2. A candidate (or, without needles, every record) is read back and its id and headers
   decoded; the selectors are evaluated on that view (no :class:`~.message.Message`,
   nothing made resident). An expired one is taken and dropped.
3. A message a ready consumer's selector matches is taken (made resident, charged) and
   delivered to that consumer at once, round-robin as selection.py does; a miss is
   *passed*: it stays paged, in its place, and the list's scan cursor moves past it,
   so it is not looked at again until the consumers change (:meth:`Queue.add_consumer`
   starts the scan again from the front).
4. A message only consumers without credit want stops the scan there (it keeps its
   place; the scan goes on from it when one of them has credit again, as its ACK
   dispatches the queue). If other consumers still have credit, selection.py pages
   the next window in for them as before the scan existed (taking from the front
   starts the scan over later), so that none waits behind a slow consumer's message.

Order. Nothing the scan passes leaves the list, and everything it takes is delivered
at once, so the queue's order is kept without sorting: a consumer that arrives later
(or a consumer without a selector, which takes from the front) meets the passed
messages first, in their places, before anything behind them. With priorities, the
scan stops as soon as the resident front outranks the next paged message
(:meth:`PagedScanner.scan_top` is what is left to scan).

Cost. With needles, a miss costs its share of a batched ``pread`` and a ``bytes.find``
over it, and a step of the list's cursor (about 1 µs of broker CPU per message passed
over, BENCHMARKS.md); without, a read with its CRC, decoding its headers and the
evaluation. Never a Message, the memory gauge, a ``seq`` or the unmatched deque.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from amqtransport.selector import MessageView, message_view

from ..store.paging import record_fields
from ..store.records import RecordError, enq_expires, header_needles
from .consumers import group_of
from .memory import MemoryGauge
from .message import Message
from .model import AUTO, Subscription
from .priority import insert, priority_of

__all__ = ["PagedScanner", "scannable", "scan_paged", "deliver"]

T = TypeVar("T")
BATCH = 256  # records read back at once


class PagedScanner(Protocol):
    """What a scan needs of the store (store/paging.py, by destination)."""

    def scan_batch(self, destination: str, n: int, *, by_priority: bool, needles: Sequence[bytes] | None,
                   ) -> tuple[list[tuple[int, int, int, bytes | Message | None]], tuple[int, int] | None]: ...

    def scan_pass(self, destination: str, i: int, p: int) -> None: ...

    def scan_take(self, destination: str, i: int, payload: bytes | Message | None) -> Message | None: ...

    def scan_end(self, destination: str) -> None: ...


class _Core(Protocol):
    memory: MemoryGauge
    clock: Callable[[], float]

    def drop_expired(self, msg: Message) -> None: ...

    def scanner(self) -> PagedScanner | None: ...


class ScanQueue(Protocol):
    """What a scan needs of a :class:`~.queues.Queue`."""

    name: str
    messages: deque[Message]
    consumers: list[Subscription]
    selective: int
    ranked: int
    grouped: bool
    prioritized: bool
    dequeued: int
    seq: int

    @property
    def core(self) -> _Core: ...


def scannable(q: ScanQueue) -> bool:
    """Do ``q``'s paged messages go through a scan (the module docstring)?"""
    return bool(q.selective) and not q.ranked and not q.grouped and all(c.selector is not None for c in q.consumers)


def deliver(q: ScanQueue, ready: deque[Subscription], sub: Subscription, msg: Message, auto_acked: list[str]) -> None:
    """Hand ``msg`` to ``sub`` (taken off ``ready``), which goes back to the end of
    ``ready`` while it has credit."""
    msg.delivery_count += 1
    if sub.ack_mode == AUTO:
        if msg.persistent:
            auto_acked.append(msg.id)
        q.dequeued += 1
        q.core.memory.release(msg)
    else:
        sub.unacked[msg.id] = msg
    sub.conn.deliver(sub, msg, msg.delivery_count)
    if sub.has_credit():
        ready.append(sub)
    else:
        sub.in_ready = False


def _needles(consumers: Sequence[Subscription]) -> tuple[bytes, ...] | None:
    pairs: list[tuple[str, str]] = []
    for c in consumers:
        req = c.selector.required if c.selector is not None else None
        if req is None:
            return None
        pairs.extend(req)
    return header_needles(pairs)


def _ready_for(ready: deque[Subscription], wants: Callable[[Subscription, T], bool], what: T) -> Subscription | None:
    """The first ready consumer (round-robin) with credit that ``wants`` ``what``,
    taken off ``ready``; consumers found without credit leave it."""
    for _ in range(len(ready)):
        cand = ready.popleft()
        if not cand.has_credit():
            cand.in_ready = False
            continue
        if wants(cand, what):
            return cand
        ready.append(cand)
    return None


def _pass_or_hold(store: PagedScanner, name: str, i: int, pri: int, consumers: Sequence[Subscription],
                  wants: Callable[[Subscription, T], bool], what: T) -> bool:
    """No ready consumer wants the message at ``i``: hold the scan there (True) when a
    consumer without credit wants it (step 4 of the module docstring), else pass it
    (step 3: the cursor moves past it)."""
    if any(not c.in_ready and wants(c, what) for c in consumers):
        store.scan_pass(name, i, pri)
        return True
    store.scan_pass(name, i + 1, pri)
    return False


def scan_paged(q: ScanQueue, ready: deque[Subscription], auto_acked: list[str],
               accepts: Callable[[Subscription, Message], bool]) -> bool:
    """Deliver ``q``'s paged messages its ready consumers' selectors match, passing the
    misses (the module docstring), until the consumers have no credit left, the scan
    reaches the end, the resident front outranks what is left, or a message with a
    group comes (it goes to the front of ``q.messages``: consumers.py decides). True
    when it stopped at a message only consumers without credit want. ``accepts`` is
    selection.py's, for a non-persistent message waiting in the list."""
    core = q.core
    store = core.scanner()
    if store is None:
        return False
    name, consumers = q.name, q.consumers
    needles = _needles(consumers)
    prioritized = q.prioritized
    floor = priority_of(q.messages[0]) if prioritized and q.messages else -1
    now = core.clock()
    try:
        while ready:
            batch, end = store.scan_batch(name, BATCH, by_priority=prioritized, needles=needles)
            if end is None:
                return False
            for i, pos, pri, rec in batch:
                if not ready or pri <= floor:  # no credit left; the resident front outranks the rest
                    store.scan_pass(name, i, pri)
                    return False
                if isinstance(rec, Message):  # non-persistent, waiting in its place (charged)
                    msg: Message = rec
                    if msg.expires and msg.expires <= now:
                        store.scan_take(name, i, rec)
                        core.drop_expired(msg)
                        continue
                    sub = _ready_for(ready, accepts, msg)
                    if sub is None:
                        if _pass_or_hold(store, name, i, pri, consumers, accepts, msg):
                            return True
                        continue
                    store.scan_take(name, i, rec)
                else:
                    if rec is None or _expired(rec, now):  # unreadable (logged, gone) or expired
                        if (gone := store.scan_take(name, i, rec)) is not None:
                            core.memory.charge(gone)
                            core.drop_expired(gone)
                        continue
                    view = _decoded(rec, pos, name)
                    if view is None:
                        store.scan_take(name, i, rec)  # it does not decode: logged and gone
                        continue
                    sub = _ready_for(ready, _matches, view)
                    if sub is None:
                        if _pass_or_hold(store, name, i, pri, consumers, _matches, view):
                            return True
                        continue
                    taken = store.scan_take(name, i, rec)
                    if taken is None:  # unreadable: logged and gone
                        ready.appendleft(sub)
                        continue
                    msg = taken
                    core.memory.charge(msg)
                    msg.view = view
                q.seq += 1
                msg.seq = q.seq
                if group_of(msg):  # consumers.py's rules from now on
                    q.grouped = True
                    ready.appendleft(sub)
                    _requeue(q, msg)
                    return False
                deliver(q, ready, sub, msg, auto_acked)
            store.scan_pass(name, *end)  # the misses after the last candidate
        return False
    finally:
        store.scan_end(name)


def _expired(rec: bytes, now: float) -> bool:
    expires = enq_expires(rec)
    return bool(expires) and expires <= now


def _decoded(rec: bytes, pos: int, name: str) -> MessageView | None:
    """What a selector sees of the message of record ``rec`` (None: it does not decode)."""
    try:
        mid, dest, headers, ts, count = record_fields(rec, pos, name)
    except RecordError:
        return None
    return message_view(headers, message_id=mid, destination=dest, timestamp_ms=int(ts * 1000), delivery_count=count)


def _matches(sub: Subscription, view: MessageView) -> bool:
    """``accepts`` for a paged message (read back, a message has no origin: noLocal passes)."""
    sel = sub.selector
    return sel is not None and sel.matches(view)


def _requeue(q: ScanQueue, msg: Message) -> None:
    """A taken message the scan does not deliver goes to the resident front, in order."""
    if q.prioritized:
        insert(q.messages, msg)
    else:
        q.messages.appendleft(msg)
