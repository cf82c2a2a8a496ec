"""Wildcard queue consumers.

Theory of operation
-------------------
Wildcard queue consumers (``/queue/a.>``, ``/queue/a.*.c``; ActiveMQ 5 semantics as
for topics below, ``a.>`` also matching ``a``). The wildcard is not a queue: the
subscription gets one *child* subscription per matching queue -- every existing one
at SUBSCRIBE, and each one created later (``queue()`` checks the wildcard list when
it creates a queue). The children are ordinary consumers of their queue (round-robin
with the queue's other consumers, the same dispatch loop) that share their parent's
``unacked`` dict, so prefetch credit is per subscription across all matched queues.
When credit returns, the parent offers it to its queues in turn and moves a queue
that used some to the back, so one busy queue cannot starve the others. Messages
keep their real destination; ACK/NACK go through the parent; unacked messages go
back to (or dead-letter from) each message's own queue; unsubscribing detaches every
child. Each child counts in its queue's ``consumerCount`` advisory. A SEND to a
wildcard queue is refused (:func:`check_send_destination`).
"""

from __future__ import annotations

from collections import OrderedDict

from amqtransport.destinations import QUEUE_PREFIX, TEMP_QUEUE_PREFIX, match, wildcard_segments

from .advisories import Advisories
from .model import Subscription
from .queues import Queue
from .registry import Registry

__all__ = ["WildcardQueues"]


class WildcardQueues:
    """Wildcard queue consumers: one child consumer per matching queue, sharing the
    parent's credit (see the module docstring)."""

    def __init__(self, reg: Registry, advisories: Advisories) -> None:
        self.reg = reg
        self.advisories = advisories

    @staticmethod
    def matches(sub: Subscription, key: str) -> bool:
        """Is queue ``key`` (``/queue/a.b``) one that wildcard queue ``sub`` reads?"""
        assert sub.pattern is not None
        prefix = QUEUE_PREFIX if sub.destination.startswith(QUEUE_PREFIX) else TEMP_QUEUE_PREFIX
        if not key.startswith(prefix):
            return False
        name = key[len(prefix) :]
        if wildcard_segments(name) is not None:
            return False  # never a real queue; a wildcard is not read by another wildcard
        return match(sub.pattern, name.split("."))

    def add(self, sub: Subscription, pattern: tuple[str, ...]) -> None:
        """Make ``sub`` a wildcard queue consumer of ``pattern``: a child on every queue it matches."""
        reg = self.reg
        sub.pattern = pattern
        sub.children = OrderedDict()
        reg.wildcard_queue_subs.append(sub)
        for key, matched in list(reg.queues.items()):
            if self.matches(sub, key):
                self.attach(sub, matched)

    def queue_created(self, q: Queue) -> None:
        """A queue was created: every wildcard consumer it matches gets a child on it."""
        for sub in list(self.reg.wildcard_queue_subs):
            if self.matches(sub, q.name):
                self.attach(sub, q)

    def attach(self, sub: Subscription, q: Queue) -> None:
        """Give wildcard queue ``sub`` a child consumer on ``q`` (sharing its credit)."""
        assert sub.children is not None
        if q.name in sub.children:
            return
        child = Subscription(sub.conn, sub.id, sub.destination, sub.ack_mode, sub.prefetch)
        child.unacked = sub.unacked
        child.name = q.name
        child.selector = sub.selector
        child.no_local = sub.no_local
        child.exclusive, child.consumer_priority = sub.exclusive, sub.consumer_priority
        sub.children[q.name] = child
        q.add_consumer(child)
        self.advisories.advise(q.name, len(q.consumers))

    def detach_all(self, sub: Subscription) -> None:
        assert sub.children is not None
        reg = self.reg
        if sub in reg.wildcard_queue_subs:
            reg.wildcard_queue_subs.remove(sub)
        for key, child in list(sub.children.items()):
            child.active = False
            q = reg.queues.get(key)
            if q is None:
                continue
            q.remove_consumer(child)
            self.advisories.advise(key, len(q.consumers))
        sub.children.clear()

    def ready(self, sub: Subscription) -> None:
        """Offer a wildcard queue subscription's credit to each matched queue in turn; a
        queue that used some goes to the back of the order, so one busy queue cannot
        starve the others when credit is short (prefetch is per subscription)."""
        assert sub.children is not None
        served: list[str] = []
        for key, child in list(sub.children.items()):
            if not child.has_credit():
                break
            q = self.reg.queues.get(key)
            if q is None:
                continue
            before = q.depth
            q.make_ready(child)
            if q.depth < before:
                served.append(key)
        for key in served:
            if key in sub.children:
                sub.children.move_to_end(key)
