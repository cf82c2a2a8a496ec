"""A queue and its dispatch loop.

Theory of operation
-------------------
Queues (``/queue/X``). A queue holds a deque of messages waiting for a consumer and
a deque of *ready* subscriptions -- those with credit (``prefetch`` minus unacked
messages; auto-ack subscriptions only need a writable connection). Dispatch pops a
ready subscription, hands it the head message and, if it still has credit, appends
it to the back of the ready deque: round-robin, O(1) per message, no scan over
consumers. A subscription re-enters the ready deque when it gains credit (an ACK, a
NACK, its socket draining). A message handed to an auto-ack subscription is acked at
once (one journal record per dispatch round, not per message); otherwise it sits in
the subscription's ``unacked`` ordered dict until ACK (client-individual: that
message; client: it and every earlier one), NACK, or the subscription/connection
going away -- then it goes back to the *front* of the queue with its delivery count
raised, and, once it has been delivered ``1 + max_redeliveries`` times, to
``/queue/DLQ.X`` instead (a journalled ``Move``).

Paging. The deque holds only the front of a queue: its owner may *page out* a message
as it is enqueued (:meth:`QueueOwner.page_out`: a persistent message beyond the queue's
in-memory window, or while memory is short, leaves memory for the back of the queue's
list in the store, as its journal position -- unless a ready consumer takes it at once;
once a queue has paged messages, every later one, non-persistent ones too, queues
behind them there, so the order holds). Dispatch *pages in*
(:meth:`QueueOwner.page_in`) from the front of that list whenever the deque runs dry: a
window's worth, or while memory is short only what the ready consumers take now. So everything a consumer sees -- order,
prefetch, redelivery to the front, expiry at dispatch, the DLQ -- happens to resident
messages exactly as without paging; a paged message is simply further back.
:attr:`Queue.depth` counts both.

Selective consumers. When every consumer has a selector, dispatch looks at paged
messages where they are instead of paging them in: :mod:`.scan` delivers the matches
and leaves the misses paged, in their places.

Priority. With ``prioritized_messages`` (the default) the deque is kept in priority
order, FIFO within a priority, paged messages come back by priority, and dispatch pages
in as soon as a paged message outranks the deque's front: see :mod:`.priority`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from ..store.journal import Callback
from .consumers import added, group_of, owner_left
from .memory import MemoryGauge
from .message import Message
from .model import Subscription
from .priority import insert, priority_of, put_back
from .scan import PagedScanner, deliver
from .selection import dispatch_selective, settle

__all__ = ["Queue", "QueueOwner"]


class QueueOwner(Protocol):
    """What a queue needs from the broker around it (the :class:`Registry`)."""

    memory: MemoryGauge
    clock: Callable[[], float]
    prioritized: bool  # the broker's prioritized_messages

    def drop_expired(self, msg: Message) -> None: ...

    def store_ack(self, ids: Sequence[str], callback: Callback | None = None) -> None: ...

    def page_out(self, queue: Queue, msg: Message) -> bool:
        """Should ``msg``, being enqueued, wait paged instead of in ``queue``'s deque? If
        so it is paged (and not charged to memory, unless it is non-persistent)."""
        ...

    def page_in(self, queue: Queue) -> list[Message]:
        """The next paged messages of ``queue``, a window's worth, now resident and charged."""
        ...

    def paged(self, queue: Queue) -> int:
        """How many of ``queue``'s messages are paged."""
        ...

    def paged_top(self, queue: Queue) -> int:
        """The highest priority among ``queue``'s paged messages, -1 when none is paged."""
        ...

    def scan_top(self, queue: Queue) -> int:
        """``paged_top`` of what the scan of ``queue``'s paged messages has not passed (scan.py)."""
        ...

    def rescan(self, queue: Queue) -> None:
        """``queue``'s consumers changed: the scan of its paged messages starts again at the front."""
        ...

    def scanner(self) -> PagedScanner | None:
        """The store, which scans paged messages where they are (scan.py); None without one."""
        ...


class Queue:
    __slots__ = ("core", "name", "messages", "consumers", "ready", "enqueued", "dequeued", "expired",
                 "selective", "unmatched", "seq", "prioritized", "ranked", "grouped",
                 "exclusive_owner", "groups")

    def __init__(self, core: QueueOwner, name: str) -> None:
        self.core = core
        self.name = name
        self.messages: deque[Message] = deque()
        self.consumers: list[Subscription] = []
        self.ready: deque[Subscription] = deque()
        self.enqueued = 0
        self.dequeued = 0
        self.expired = 0
        self.selective = 0  # consumers with a selector: dispatch is selection.dispatch_selective
        self.unmatched: deque[Message] = deque()  # resident messages no consumer's selector matches
        self.seq = 0  # the last Message.seq given
        self.prioritized = core.prioritized  # messages in priority order (priority.py)
        # consumers.py: exclusive consumers, consumer priority, message groups
        self.ranked = 0  # consumers that are exclusive or have a priority
        self.grouped = False  # a message with a JMSXGroupID has been here
        self.exclusive_owner: Subscription | None = None
        self.groups: dict[str, Subscription] = {}  # JMSXGroupID -> the consumer that owns it

    @property
    def depth(self) -> int:
        """Messages waiting: in memory and paged."""
        return len(self.messages) + len(self.unmatched) + self.core.paged(self)

    def enqueue(self, msg: Message) -> None:
        self.enqueued += 1
        if self.core.page_out(self, msg):
            if self.ready and (not self.messages or self.prioritized):
                self.dispatch()  # prioritized: it may outrank the resident front
            return
        self.core.memory.charge(msg)
        self.seq += 1
        msg.seq = self.seq
        if not self.grouped and group_of(msg):
            self.grouped = True
        if self.prioritized:
            insert(self.messages, msg)
        else:
            self.messages.append(msg)
        if self.ready:
            self.dispatch()

    def requeue(self, msgs: Sequence[Message]) -> None:
        """Put messages back at the front, keeping their relative order."""
        for m in reversed(msgs):
            if self.prioritized:
                put_back(self.messages, m)
            else:
                self.messages.appendleft(m)
        self.dispatch()

    def make_ready(self, sub: Subscription) -> None:
        if not sub.in_ready and sub.has_credit():
            sub.in_ready = True
            self.ready.append(sub)
        if self.ready and (self.messages or self.core.paged(self)):
            self.dispatch()

    def dispatch(self) -> None:
        if self.selective or self.ranked or self.grouped:
            dispatch_selective(self)
            return
        messages, ready = self.messages, self.ready
        auto_acked: list[str] = []
        now = 0.0
        top = self.core.paged_top(self) if self.prioritized else -1
        while ready:
            if not messages or (top >= 0 and priority_of(messages[0]) < top):
                self.page_in()  # dry, or paged messages outrank the front (priority.py)
                top = self.core.paged_top(self) if self.prioritized else -1
                if not messages or self.grouped:
                    break  # grouped: a message with a group came in, consumers.py decides now
            sub = ready.popleft()
            if not sub.has_credit():
                sub.in_ready = False
                continue
            msg = messages.popleft()
            if msg.expires:
                now = now or self.core.clock()
                if msg.expires <= now:
                    ready.appendleft(sub)
                    self.core.drop_expired(msg)
                    continue
            deliver(self, ready, sub, msg, auto_acked)
        if auto_acked:
            self.core.store_ack(auto_acked)
        if self.grouped and messages and ready:
            dispatch_selective(self)

    def paged_top(self) -> int:
        """The highest priority among the paged messages, -1 when none is paged."""
        return self.core.paged_top(self)

    def scan_top(self) -> int:
        """The highest priority among the paged messages the scan has not passed (scan.py)."""
        return self.core.scan_top(self)

    def page_in(self) -> None:
        """Bring the next paged messages to the back of the deque, in order."""
        for m in self.core.page_in(self):
            self.seq += 1
            m.seq = self.seq
            if not self.grouped and group_of(m):
                self.grouped = True
            if self.prioritized:
                insert(self.messages, m)
            else:
                self.messages.append(m)

    def add_consumer(self, sub: Subscription) -> None:
        self.consumers.append(sub)
        if sub.selector is not None or sub.no_local:
            self.selective += 1
        if sub.exclusive or sub.consumer_priority:
            self.ranked += 1
            added(self, sub)
        settle(self)  # a new consumer may want what nobody wanted
        self.core.rescan(self)  # ... resident or paged (scan.py)
        self.make_ready(sub)

    def remove_consumer(self, sub: Subscription) -> None:
        if sub.in_ready:
            sub.in_ready = False
            try:
                self.ready.remove(sub)
            except ValueError:
                pass
        if sub in self.consumers:
            self.consumers.remove(sub)
            if sub.exclusive or sub.consumer_priority:
                self.ranked -= 1
            owned = owner_left(self, sub)  # consumers.py: its groups, the queue if it was exclusive
            if sub.selector is not None or sub.no_local:
                self.selective -= 1
                if not self.selective:
                    owned = True
            if owned:
                settle(self)  # plain dispatch again, or a new owner: nothing stays set aside
                if not sub.unacked and self.ready:
                    self.dispatch()  # what waited for it goes on (no redelivery will wake us)
