"""Which of a queue's consumers may have a message: exclusive consumers, consumer
priority and message groups, as ActiveMQ 5.17 decides them.

Theory of operation
-------------------
Three SUBSCRIBE/SEND headers narrow the round-robin of :mod:`.queues`:

* ``activemq.exclusive:true`` -- while the queue has an exclusive consumer, its
  *owner* (``Queue.exclusive_owner``) is the only consumer that gets messages. The
  first exclusive consumer becomes the owner; a later one takes over only with a
  higher ``activemq.priority`` (or 127), as in ActiveMQ's ``Queue.addSubscription``.
  When the owner leaves (its unacked messages come back), the next exclusive consumer
  -- highest priority, then the oldest -- owns the queue; with none left, every
  consumer shares it again.
* ``activemq.priority:N`` (-128..127, default 0) -- a message goes to the
  highest-priority consumer that has room (credit); consumers of one priority share
  round-robin. Lower-priority consumers get messages only while the higher ones are
  full.
* ``JMSXGroupID`` on a message -- the first consumer that gets a message of a group
  owns the group (``Queue.groups``) until it leaves; then the group's messages go to
  whichever consumer gets the next one. As in ActiveMQ's ``Queue.assignMessageGroup``,
  a negative ``JMSXGroupSeq`` (``-1``) closes the group after that message (the next
  message of the group picks an owner again), and ``JMSXGroupSeq:1`` starts it afresh:
  whichever consumer gets that message owns the group from then on. A message whose
  group owner has no room waits, in its place, while other messages go on to other
  consumers. ActiveMQ 5.17 puts ``JMSXGroupFirstForConsumer`` on the JMS message only:
  over STOMP its MESSAGE frames carry neither that nor ``JMSXGroupID``; ours carry the
  producer's headers as sent (``JMSXGroupID`` among them) and no
  ``JMSXGroupFirstForConsumer`` either.

A queue uses these rules (per-message dispatch, :func:`.selection.dispatch_selective`)
only once it needs them: ``Queue.ranked`` counts consumers that are exclusive or have
a priority, ``Queue.grouped`` is set by the first message with a group. Otherwise its
dispatch stays the O(1) round-robin. Picking a consumer is one pass over the ready
ones (a handful, typically); nothing here is persisted: ownership is the live
consumers' (after a restart or a takeover the consumers subscribe again and the
groups are assigned afresh, as in ActiveMQ, whose group map is in memory too).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Protocol

from .message import Message
from .model import Subscription

__all__ = ["GROUP_HEADER", "GroupedQueue", "added", "assigned", "eligible", "group_of", "owner_left", "pick"]

GROUP_HEADER = "JMSXGroupID"
GROUP_SEQ_HEADER = "JMSXGroupSeq"


class GroupedQueue(Protocol):
    consumers: list[Subscription]
    ready: deque[Subscription]
    exclusive_owner: Subscription | None
    groups: dict[str, Subscription]


def group_of(msg: Message) -> str:
    """``msg``'s message group ("" for none; cached on it)."""
    g = msg.group
    if g is None:
        g = ""
        for k, v in msg.headers:
            if k == GROUP_HEADER:
                g = v
                break
        msg.group = g
    return g


def eligible(q: GroupedQueue, sub: Subscription, msg: Message) -> bool:
    """May ``sub`` have ``msg`` as far as exclusivity and groups go (selectors aside)?"""
    owner = q.exclusive_owner
    if owner is not None and sub is not owner:
        return False
    g = msg.group
    if g:
        o = q.groups.get(g)
        if o is not None and o is not sub and group_seq(msg) != 1:
            return False
    return True


def group_seq(msg: Message) -> int:
    """``msg``'s JMSXGroupSeq (0 when it has none or it is not an integer)."""
    for k, v in msg.headers:
        if k == GROUP_SEQ_HEADER:
            try:
                return int(v)
            except ValueError:
                return 0
    return 0


def pick(q: GroupedQueue, msg: Message, accepts: Callable[[Subscription, Message], bool]) -> Subscription | None:
    """The ready consumer with credit, of the highest priority, first in round-robin
    order, that may have ``msg`` (``accepts(sub, msg)``: its selector and noLocal);
    taken out of the ready deque. Consumers without credit leave the deque."""
    ready = q.ready
    best: Subscription | None = None
    best_i = -1
    i = 0
    while i < len(ready):
        cand = ready[i]
        if not cand.has_credit():
            cand.in_ready = False
            del ready[i]
            continue
        if (best is None or cand.consumer_priority > best.consumer_priority) and eligible(q, cand, msg) \
                and accepts(cand, msg):
            best, best_i = cand, i
        i += 1
    if best is not None:
        del ready[best_i]
    return best


def assigned(q: GroupedQueue, sub: Subscription, msg: Message) -> None:
    """``sub`` is being handed ``msg``: it owns ``msg``'s group now (until the group closes)."""
    g = msg.group
    if not g:
        return
    if group_seq(msg) < 0:
        q.groups.pop(g, None)
    else:
        q.groups[g] = sub


def added(q: GroupedQueue, sub: Subscription) -> None:
    """A new consumer: it becomes the exclusive owner if it is the first exclusive one,
    or outranks the owner (or has priority 127), as ActiveMQ does."""
    if not sub.exclusive:
        return
    owner = q.exclusive_owner
    if owner is None or sub.consumer_priority == 127 or sub.consumer_priority > owner.consumer_priority:
        q.exclusive_owner = sub


def owner_left(q: GroupedQueue, sub: Subscription) -> bool:
    """``sub`` left (already out of ``q.consumers``): its groups are free and, if it was
    the exclusive owner, the next exclusive consumer owns the queue. True if it owned
    anything (the caller reconsiders the messages set aside)."""
    owned = False
    if q.groups:
        mine = [g for g, o in q.groups.items() if o is sub]
        for g in mine:
            del q.groups[g]
        owned = bool(mine)
    if q.exclusive_owner is sub:
        owned = True
        nxt: Subscription | None = None
        for c in q.consumers:
            if c.exclusive and (nxt is None or c.consumer_priority > nxt.consumer_priority):
                nxt = c
        q.exclusive_owner = nxt
    return owned
