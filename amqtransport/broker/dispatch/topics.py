"""Topics: fan-out to live subscriptions and to durable subscriptions' queues.

Theory of operation
-------------------
Topics (``/topic/X``). Publishing fans out to every subscription of the topic (and to
wildcard subscriptions, ActiveMQ syntax: ``.`` separates, ``*`` one part, ``>`` the
rest). A topic subscription without credit buffers in its own bounded backlog (the
oldest are dropped past ``topic_backlog_limit`` messages or ``topic_backlog_bytes``
bytes -- topics are not durable; :mod:`.backlog`).
Durable subscriptions (``activemq.subscriptionName`` + the connection's
``client-id``) are internal queues named ``durable:<client-id>:<name>``; a persistent
message published to the topic is copied into each of them, so they survive restarts
and offline periods like any queue; the journal holds the message once, with a
reference per copy (a ``Fan`` record, :mod:`..store.fanout`). An offline durable
subscription pages from its first message (``Registry.offline_durable``); once a topic
message went to every durable subscription as a position only, the topic has a *plan*
(:meth:`FanOut._plan`) and the next ones go to the store's shared tail of those
queues in one step (``MessageStore.add_shared``) while nothing changed that would send
them elsewhere: the same subscriptions, none read since, no priority above a paged one.
A virtual
topic's consumer queues (``/queue/Consumer.A.VirtualTopic.X``, :mod:`.virtual`) are
durable subscriptions of this kind whose queue is the consumer queue itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from amqtransport.destinations import match

from ..store.fanout import fan_copy
from ..store.journal import Callback
from .message import Message
from .model import AUTO, Subscription
from .priority import priority_of
from .registry import Registry
from .selection import accepts, view_of

__all__ = ["FanOut"]

log = logging.getLogger(__name__)


class FanOut:
    """Topic messages: the durable subscriptions' copies, and the live subscriptions
    (wildcards included), each with its bounded backlog while it has no credit."""

    def __init__(self, reg: Registry) -> None:
        self.reg = reg
        #: topic -> (Registry.durable_version, its durable queues, the highest priority that
        #: pages at once in all of them): see publish
        self._plans: dict[str, tuple[int, tuple[str, ...], int]] = {}

    def publish(self, name: str, msg: Message, callback: Callback | None) -> None:
        reg = self.reg
        store = reg.store
        if msg.persistent and store is not None:
            plan = self._plans.get(name)
            if (
                plan is not None
                and plan[0] == reg.durable_version
                and store.shares(plan[1])
                and (plan[2] >= 9 or priority_of(msg) <= plan[2])
                and store.add_shared(msg, plan[1], callback)
            ):
                # every durable subscription of the topic pages and has no selector (the
                # same subscriptions as when the plan was made): one shared position
                reg.paged_arrivals(plan[1], msg)
                self.fan_out(name, msg, ())
                return
        targets = self.durable_targets(name, msg)
        copies: list[Message] = []
        if msg.persistent and store is not None and targets:
            # a queue that already pages takes its copy as a position only (no Message)
            paged = reg.pages_at_once(targets, msg)
            fan: Sequence[Message | str]
            if paged:
                fan = [q if q in paged else fan_copy(msg, q) for q in targets]
                copies = [c for c in fan if not isinstance(c, str)]
            else:
                fan = copies = [fan_copy(msg, q) for q in targets]
            if store.add_fan(msg, fan, callback):
                if paged:
                    reg.paged_arrivals(paged, msg)
                    if len(paged) == len(targets):
                        self._plan(name, targets)
                self.fan_out(name, msg, copies)
                return
            copies = [fan_copy(msg, q) for q in targets]
            key = (msg.destination, msg.key, msg.timestamp) if msg.key else None  # persisted with the copies
            store.add_many(copies, callback, key=key)
        else:
            copies = [fan_copy(msg, q) for q in targets]
            if msg.key and store is not None:
                store.remember_key(msg.destination, msg.key)
            reg.done(callback)
        self.fan_out(name, msg, copies)

    def _plan(self, name: str, targets: list[str]) -> None:
        """Topic ``name``'s message went to every durable subscription as a position only:
        the next ones may too, without asking each subscription (:meth:`publish`), while
        the subscriptions stay these (none with a selector), every one's list still
        shares the tail this one went to (store/fanout.py) and the message's priority is
        at most every prioritized queue's highest paged one (Registry.pages_at_once)."""
        reg = self.reg
        topic = reg.topics.get(name)
        if topic is None or len(topic.durable) != len(targets) or any(q in reg.durable_selectors for q in targets):
            self._plans.pop(name, None)
            return
        queues = [reg.queues[q] for q in targets]
        top = min((q.paged_top() for q in queues if q.prioritized), default=9)
        self._plans[name] = (reg.durable_version, tuple(targets), top)

    def durable_targets(self, name: str, msg: Message) -> list[str]:
        """The queues of the durable subscriptions of topic ``name`` that take topic
        message ``msg`` (their selectors)."""
        topic = self.reg.topics.get(name)
        if topic is None or not topic.durable:
            return []
        selectors = self.reg.durable_selectors
        return [q for q in topic.durable if q not in selectors or selectors[q].matches(view_of(msg))]

    def durable_copies(self, name: str, msg: Message) -> list[Message]:
        """One copy of topic message ``msg`` per durable subscription of topic ``name``."""
        return [fan_copy(msg, q) for q in self.durable_targets(name, msg)]

    def fan_out(self, name: str, msg: Message, copies: Sequence[Message]) -> None:
        """Hand topic message ``msg`` (already persisted) to its durable copies' queues
        and to every live subscription of topic ``name``, wildcards included."""
        reg = self.reg
        for copy in copies:
            reg.queue(copy.destination).enqueue(copy)
        topic = reg.topics.get(name)
        if topic is not None:
            topic.enqueued += 1
            for sub in topic.subs:
                self.offer(sub, msg)
        if reg.wildcard_subs and not name.startswith("/"):  # a temporary topic's name is its key: no wildcard reads it
            parts = name.split(".")
            for sub in reg.wildcard_subs:
                assert sub.pattern is not None
                if match(sub.pattern, parts):
                    self.offer(sub, msg)

    def offer(self, sub: Subscription, msg: Message) -> None:
        if (sub.selector is not None or sub.no_local) and not accepts(sub, msg):
            return
        if not sub.backlog and sub.has_credit():
            self.deliver(sub, msg)
            return
        backlog = sub.backlog
        before = backlog.dropped
        config = self.reg.config
        if backlog.append(msg, config.topic_backlog_limit, config.topic_backlog_bytes):
            if len(str(before)) != len(str(backlog.dropped)) or before == 0:  # at 1, 10, 100, ... dropped
                log.warning(
                    "topic subscription %s: slow consumer, %d messages dropped (backlog: %d messages, %d bytes)",
                    sub.destination,
                    backlog.dropped,
                    len(backlog),
                    backlog.bytes,
                )

    def deliver(self, sub: Subscription, msg: Message) -> None:
        if msg.expires and msg.expires <= self.reg.clock():
            return
        if sub.ack_mode != AUTO:
            sub.unacked[msg.id] = msg
        sub.conn.deliver(sub, msg, 1)

    def drain(self, sub: Subscription) -> None:
        while sub.backlog and sub.has_credit():
            self.deliver(sub, sub.backlog.popleft())
