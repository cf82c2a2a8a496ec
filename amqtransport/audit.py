"""The client's duplicate filter (ActiveMQ's "message audit") and the acks it owes.

Theory of operation
-------------------
A message is identified by ``(subscription, key)``, the key being its idempotency
header (``amq-idempotency-key``, else Artemis' ``_AMQ_DUPL_ID``, else the
``message-id``: brokers such as RabbitMQ give a redelivered message a new
``message-id`` but keep our header). The filter is a bounded LRU of those. The first
arrival goes to the application; every later one (a redelivery after a failover, a
copy a broker stored twice after a replayed SEND) is dropped.

A dropped copy is still a delivery the broker waits an ACK for (client ack modes):
unacknowledged it would hold a prefetch slot and come back on the next link. It must
be acknowledged, but never before the application has acknowledged the original (else
a crash in between loses the message), and in ``client`` mode never by an ACK that
covers something the application has not acknowledged:

- ``client-individual``: a copy is acked as soon as its original is (on arrival if the
  original was acked already, else right after the application's ACK of the original;
  an ACK that could not go out because the original's link died counts too: the broker
  redelivers the original, and that copy is acked on arrival).
- ``client``: an ACK is cumulative: it acknowledges every earlier delivery of the
  subscription on that link. So each subscription keeps its unsettled deliveries in
  order; a copy may be acked only once it is at the head (everything delivered before
  it is settled) and its original is acked; one ACK of the last such copy covers all.
  An application ACK settles everything delivered before it on that link (and marks
  those originals acked).
- A NACK in ``client`` mode is cumulative too (STOMP; RabbitMQ and our broker requeue
  every earlier unacked delivery): everything it covers is settled and forgotten by
  the filter, so the redeliveries reach the application again; acking one of those
  messages afterwards is refused (the broker no longer knows that delivery).

The class keeps no I/O: it returns the deliveries to acknowledge and the caller
writes the frames on the delivery's own link (a stale link's ACK is simply not sent).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from amqtransport.stomp import IDEMPOTENCY_HEADER, Frame

__all__ = ["Delivery", "DuplicateFilter", "message_key"]

DUPLICATE_ID_HEADER = "_AMQ_DUPL_ID"


def message_key(frame: Frame) -> str:
    """What identifies a message across redeliveries (see the module docstring)."""
    key = frame.get(IDEMPOTENCY_HEADER) or frame.get(DUPLICATE_ID_HEADER)
    if key is not None and frame.get("scheduledJobId") is not None:
        # a scheduled message (AMQ_SCHEDULED_REPEAT / CRON): each delivery is a message of
        # its own carrying the producer's key; its message-id tells them apart
        return f"{key}@{frame.get('message-id') or ''}"
    return key if key is not None else "id:" + (frame.get("message-id") or "")


@dataclass(eq=False)
class _Entry:
    acked: bool = False
    #: client-individual: copies waiting for the original's ACK
    copies: list[Delivery] = field(default_factory=list)


@dataclass(eq=False)
class Delivery:
    """One MESSAGE frame as delivered on link ``generation``."""

    frame: Frame
    generation: int
    key: str
    entry: _Entry | None = None
    seq: int = 0
    copy: bool = False
    #: acknowledged or rejected, by itself or by a cumulative ACK/NACK
    settled: bool = False
    #: settled by a cumulative NACK (an ACK of it afterwards is refused)
    nacked: bool = False


@dataclass(eq=False)
class _Sub:
    mode: str
    unsettled: deque[Delivery] = field(default_factory=deque)
    seq: int = 0


class DuplicateFilter:
    """Thread-safe; see the module docstring. ``size`` bounds the LRU of keys."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.duplicates = 0
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._subs: dict[str, _Sub] = {}

    def arrived(self, sub_id: str, mode: str, frame: Frame, generation: int) -> tuple[Delivery | None, list[Delivery]]:
        """A MESSAGE arrived: (the delivery for the application or None for a copy,
        deliveries to acknowledge now)."""
        key = message_key(frame)
        d = Delivery(frame, generation, key)
        with self._lock:
            sub = self._sub(sub_id, mode)
            old = self._entries.get((sub_id, key))
            if old is None:
                d.entry = _Entry()
                self._entries[(sub_id, key)] = d.entry
                while len(self._entries) > self.size:
                    self._entries.popitem(last=False)
                self._track(sub, d)
                return d, []
            self._entries.move_to_end((sub_id, key))
            self.duplicates += 1
            d.entry, d.copy = old, True
            if mode == "client-individual":
                if old.acked:
                    return None, [d]
                old.copies.append(d)
                return None, []
            if mode == "client":
                self._track(sub, d)
                return None, self._ready(sub)
            return None, []

    def acked(self, sub_id: str, d: Delivery, *, sent: bool) -> list[Delivery]:
        """The application acknowledged ``d``; ``sent`` is False when its link was gone
        (no ACK went out: the broker redelivers it and the copy is acked on arrival).
        Returns the copies to acknowledge now."""
        with self._lock:
            sub = self._subs.get(sub_id)
            if sub is None or sub.mode != "client":
                d.settled = True
                if d.entry is None:
                    return []
                d.entry.acked = True
                copies, d.entry.copies = d.entry.copies, []
                return copies
            if sent:
                for x in sub.unsettled:
                    if x.generation == d.generation and x.seq <= d.seq and not x.settled:
                        x.settled = True
                        if not x.copy and x.entry is not None:
                            x.entry.acked = True
            else:
                d.settled = True
                if d.entry is not None:
                    d.entry.acked = True
            return self._ready(sub)

    def nacked(self, sub_id: str, d: Delivery) -> list[Delivery]:
        """The application rejected ``d``: forget it (and, in ``client`` mode, every
        earlier unsettled delivery of that link, which a cumulative NACK also rejects)
        so the redeliveries reach the application. Returns the deliveries it covered."""
        with self._lock:
            sub = self._subs.get(sub_id)
            if sub is None or sub.mode != "client":
                covered = [d]
            else:
                covered = [x for x in sub.unsettled
                           if x.generation == d.generation and x.seq <= d.seq and not x.settled]
            for x in covered:
                x.settled = x.nacked = True
                if not x.copy:
                    self._entries.pop((sub_id, x.key), None)
            if sub is not None and sub.mode == "client":
                self._ready(sub)
            return [x for x in covered if not x.copy]

    def forget_one(self, sub_id: str, d: Delivery) -> None:
        """Forget ``d``'s key only (a transactional ACK that was rolled back: the
        broker redelivers it), leaving every other delivery as it is."""
        with self._lock:
            if self._entries.get((sub_id, d.key)) is d.entry:
                del self._entries[(sub_id, d.key)]

    def forget(self, sub_id: str) -> None:
        """The subscription is gone: drop its ordering state (keys age out of the LRU)."""
        with self._lock:
            self._subs.pop(sub_id, None)

    # -- internals (lock held) ---------------------------------------------------------

    def _sub(self, sub_id: str, mode: str) -> _Sub:
        sub = self._subs.get(sub_id)
        if sub is None:
            sub = self._subs[sub_id] = _Sub(mode)
        return sub

    @staticmethod
    def _track(sub: _Sub, d: Delivery) -> None:
        if sub.mode != "client":
            return
        sub.seq += 1
        d.seq = sub.seq
        sub.unsettled.append(d)

    @staticmethod
    def _ready(sub: _Sub) -> list[Delivery]:
        """Pop the settled head of ``sub``'s deliveries; the last copy it could ack
        (one cumulative ACK covers the rest)."""
        last: Delivery | None = None
        newest = sub.unsettled[-1].generation if sub.unsettled else 0
        while sub.unsettled:
            head = sub.unsettled[0]
            if head.generation != newest or head.settled:
                sub.unsettled.popleft()  # a dead link's delivery, or already covered
                continue
            if head.copy and head.entry is not None and head.entry.acked:
                head.settled = True
                last = sub.unsettled.popleft()
                continue
            break
        return [last] if last is not None else []
