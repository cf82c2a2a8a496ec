"""Destinations and dispatch: queues, topics, subscriptions, acks, redelivery, DLQ.

Theory of operation
-------------------
The core is the broker minus I/O: it is driven by the protocol handler (one call per
client frame), persists through the :class:`~.store.MessageStore`, and hands
messages to subscriptions through the small :class:`Sink` interface that a
connection implements (``writable`` + ``deliver``). Everything runs on the event
loop thread; nothing here blocks.

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

Topics (``/topic/X``). Publishing fans out to every subscription of the topic (and to
wildcard subscriptions, ActiveMQ syntax: ``.`` separates, ``*`` one part, ``>`` the
rest). A topic subscription without credit buffers in its own bounded backlog (the
oldest are dropped past ``topic_backlog_limit`` messages or ``topic_backlog_bytes``
bytes -- topics are not durable; :mod:`.backlog`).
Durable subscriptions (``activemq.subscriptionName`` + the connection's
``client-id``) are internal queues named ``durable:<client-id>:<name>``; a persistent
message published to the topic is copied into each of them (one atomic journal
record), so they survive restarts and offline periods like any queue.

Persistence is concurrent with dispatch: a persistent message is handed to a consumer
as soon as its record is queued for the journal (its ack record always follows it in
the journal, so recovery never resurrects it); the *producer's* receipt waits for
durability. Advisory messages (``/topic/ActiveMQ.Advisory.Consumer.Queue.X``, header
``consumerCount``) are published whenever a queue gains or loses a consumer, and a new
advisory subscriber is told the current counts.
"""

from __future__ import annotations

import itertools
import json
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from .backlog import TopicBacklog
from .config import BrokerConfig
from .memory import MemoryGauge, send_size
from .message import Message
from .store import Ack, Enq, JournalError, Keys, MessageStore, RecordError, Sub
from .store.journal import Callback
from .store.records import TxPart

__all__ = [
    "BrokerCore",
    "Registry",
    "FanOut",
    "Advisories",
    "WildcardQueues",
    "Acks",
    "Transactions",
    "Queue",
    "QueueOwner",
    "Topic",
    "Subscription",
    "Sink",
    "TxState",
    "TxSend",
    "CoreError",
    "check_send_destination",
    "dead_letter_name",
    "ADVISORY_PREFIX",
    "QUEUE_PREFIX",
    "TOPIC_PREFIX",
]

log = logging.getLogger(__name__)

QUEUE_PREFIX = "/queue/"
TOPIC_PREFIX = "/topic/"
TEMP_QUEUE_PREFIX = "/temp-queue/"
TEMP_TOPIC_PREFIX = "/temp-topic/"
ADVISORY_PREFIX = "ActiveMQ.Advisory.Consumer.Queue."
DURABLE_PREFIX = "durable:"

AUTO, CLIENT, INDIVIDUAL = "auto", "client", "client-individual"
ACK_MODES = (AUTO, CLIENT, INDIVIDUAL)


class CoreError(Exception):
    """A client request the core refuses; the message goes into the ERROR frame."""


class Sink(Protocol):
    """What a subscription needs from its connection."""

    @property
    def writable(self) -> bool: ...

    def deliver(self, sub: Subscription, message: Message, delivery_count: int) -> None: ...


class Subscription:
    """One SUBSCRIBE of one connection."""

    __slots__ = (
        "conn",
        "id",
        "destination",
        "kind",
        "name",
        "ack_mode",
        "prefetch",
        "unacked",
        "in_ready",
        "backlog",
        "durable_queue",
        "active",
        "pattern",
        "children",
    )

    def __init__(
        self,
        conn: Sink,
        sub_id: str,
        destination: str,
        ack_mode: str,
        prefetch: int,
    ) -> None:
        self.conn = conn
        self.id = sub_id
        self.destination = destination  # as the client wrote it
        self.kind = "queue" if destination.startswith((QUEUE_PREFIX, TEMP_QUEUE_PREFIX)) else "topic"
        self.name = destination  # internal queue/topic key this subscription reads
        self.ack_mode = ack_mode
        self.prefetch = prefetch
        self.unacked: OrderedDict[str, Message] = OrderedDict()
        self.in_ready = False
        self.backlog = TopicBacklog()
        self.durable_queue: str | None = None
        self.active = True
        self.pattern: tuple[str, ...] | None = None
        # a wildcard queue subscription: one child per matched queue (key -> child);
        # the children share this subscription's ``unacked`` dict, hence its credit
        self.children: OrderedDict[str, Subscription] | None = None

    def has_credit(self) -> bool:
        if not self.active or not self.conn.writable:
            return False
        return self.ack_mode == AUTO or len(self.unacked) < self.prefetch

    def __repr__(self) -> str:
        return f"<Subscription {self.id} {self.destination} {self.ack_mode}>"


class QueueOwner(Protocol):
    """What a queue needs from the broker around it (the :class:`Registry`)."""

    memory: MemoryGauge
    clock: Callable[[], float]

    def drop_expired(self, msg: Message) -> None: ...

    def store_ack(self, ids: Sequence[str], callback: Callback | None = None) -> None: ...


class Queue:
    __slots__ = ("core", "name", "messages", "consumers", "ready", "enqueued", "dequeued", "expired")

    def __init__(self, core: QueueOwner, name: str) -> None:
        self.core = core
        self.name = name
        self.messages: deque[Message] = deque()
        self.consumers: list[Subscription] = []
        self.ready: deque[Subscription] = deque()
        self.enqueued = 0
        self.dequeued = 0
        self.expired = 0

    def enqueue(self, msg: Message) -> None:
        self.core.memory.charge(msg)
        self.messages.append(msg)
        self.enqueued += 1
        if self.ready:
            self.dispatch()

    def requeue(self, msgs: Sequence[Message]) -> None:
        """Put messages back at the front, keeping their relative order."""
        for m in reversed(msgs):
            self.messages.appendleft(m)
        self.dispatch()

    def make_ready(self, sub: Subscription) -> None:
        if not sub.in_ready and sub.has_credit():
            sub.in_ready = True
            self.ready.append(sub)
        if self.messages and self.ready:
            self.dispatch()

    def dispatch(self) -> None:
        messages, ready = self.messages, self.ready
        auto_acked: list[str] = []
        now = 0.0
        while messages and ready:
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
            msg.delivery_count += 1
            if sub.ack_mode == AUTO:
                if msg.persistent:
                    auto_acked.append(msg.id)
                self.dequeued += 1
                self.core.memory.release(msg)
            else:
                sub.unacked[msg.id] = msg
            sub.conn.deliver(sub, msg, msg.delivery_count)
            if sub.has_credit():
                ready.append(sub)
            else:
                sub.in_ready = False
        if auto_acked:
            self.core.store_ack(auto_acked)

    def add_consumer(self, sub: Subscription) -> None:
        self.consumers.append(sub)
        self.make_ready(sub)

    def remove_consumer(self, sub: Subscription) -> None:
        if sub in self.consumers:
            self.consumers.remove(sub)
        if sub.in_ready:
            sub.in_ready = False
            try:
                self.ready.remove(sub)
            except ValueError:
                pass


@dataclass
class Topic:
    name: str
    subs: list[Subscription] = field(default_factory=list)
    durable: dict[str, str] = field(default_factory=dict)  # durable queue key -> topic name
    enqueued: int = 0  # messages published to it while it existed (metrics)


class TxSend(NamedTuple):
    """A SEND held by a transaction until its COMMIT."""

    destination: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    persistent: bool
    key: str
    size: int  # bytes reserved in the memory gauge


@dataclass
class TxState:
    """A transaction of one connection (BEGIN .. COMMIT/ABORT)."""

    id: str
    sends: list[TxSend] = field(default_factory=list)
    acked: list[tuple[Subscription, Message]] = field(default_factory=list)
    nacked: list[tuple[Subscription, Message]] = field(default_factory=list)
    size: int = 0  # bytes of its SENDs, counted against the memory limits until COMMIT/ABORT


_SPLIT_CACHE: dict[str, tuple[str, str]] = {}


def split_destination(destination: str) -> tuple[str, str]:
    """``("queue"|"topic", name)``; CoreError for anything else."""
    hit = _SPLIT_CACHE.get(destination)
    if hit is not None:
        return hit
    if len(_SPLIT_CACHE) > 10000:
        _SPLIT_CACHE.clear()
    for prefix, kind in (
        (QUEUE_PREFIX, "queue"),
        (TOPIC_PREFIX, "topic"),
        (TEMP_QUEUE_PREFIX, "queue"),
        (TEMP_TOPIC_PREFIX, "topic"),
    ):
        if destination.startswith(prefix):
            name = destination[len(prefix) :]
            if not name:
                raise CoreError(f"destination {destination!r} has an empty name")
            _SPLIT_CACHE[destination] = (kind, name)
            return kind, name
    raise CoreError(f"destination {destination!r} must start with /queue/ or /topic/")


def check_send_destination(destination: str) -> tuple[str, str]:
    """:func:`split_destination` for a SEND: a wildcard queue is refused (it names
    many queues, or none; ActiveMQ semantics are for consumers)."""
    kind, name = split_destination(destination)
    if kind == "queue" and ("*" in name or ">" in name) and _pattern(name) is not None:
        raise CoreError(
            f"cannot SEND to {destination!r}: '*' and '>' are wildcards, allowed only when subscribing "
            "to queues; send to one concrete queue"
        )
    return kind, name


def dead_letter_name(key: str) -> str:
    """What follows the DLQ prefix in the name of queue ``key``'s dead-letter queue
    (``/queue/a`` -> ``a``; a durable subscription ``durable:c:s`` -> ``c.s``)."""
    if key.startswith(DURABLE_PREFIX):
        return key[len(DURABLE_PREFIX) :].replace(":", ".")
    return split_destination(key)[1]


def _pattern(name: str) -> tuple[str, ...] | None:
    parts = tuple(name.split("."))
    return parts if ("*" in parts or ">" in parts) else None


def _matches(pattern: tuple[str, ...], parts: Sequence[str]) -> bool:
    for i, p in enumerate(pattern):
        if p == ">":
            return True
        if i >= len(parts) or (p != "*" and p != parts[i]):
            return False
    return len(parts) == len(pattern)


class Registry:
    """What exists: the queues, topics and subscriptions, the durable-subscription
    records, the counters, the memory gauge and the glue to the store. The stories
    below (:class:`FanOut`, :class:`Advisories`, :class:`WildcardQueues`,
    :class:`Acks`, :class:`Transactions`) each hold the registry and change it."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore | None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.queues: dict[str, Queue] = {}
        self.topics: dict[str, Topic] = {}
        self.wildcard_subs: list[Subscription] = []
        self.wildcard_queue_subs: list[Subscription] = []
        self.durable_subs: dict[str, Sub] = {}  # queue key -> record
        self.durable_active: dict[str, Subscription] = {}
        self._ids = itertools.count(1)
        self._prefix = f"ID:{config.name}-{secrets.token_hex(4)}-"
        self.sent = 0
        self.duplicates = 0
        self.dead_lettered = 0
        self.expired = 0
        self.shutting_down = False  # set by the server: no dead-lettering while it closes
        self.memory = MemoryGauge(config.memory_limit, config.destination_memory_limit, config.memory_low_water)
        if store is not None:
            store.on_space = self.memory.wake_waiters  # store flow control parks in the same list
        #: called with each queue created while wildcard queue consumers exist (they attach to it)
        self.queue_created: Callable[[Queue], None] | None = None

    # ------------------------------------------------------------------ startup
    def load_from_store(self) -> int:
        """Create destinations for every live message and durable subscription."""
        if self.store is None:
            return 0
        for sub in self.store.subs.values():
            self.register_durable(sub)
        n = 0
        for dest, msgs in self.store.messages_by_destination().items():
            q = self.queue(dest)
            for m in msgs:
                self.memory.charge(m)
            q.messages.extend(msgs)
            q.enqueued += len(msgs)
            n += len(msgs)
        return n

    def register_durable(self, sub: Sub) -> None:
        self.durable_subs[sub.queue] = sub
        self.topic(sub.topic).durable[sub.queue] = sub.topic
        self.queue(sub.queue)

    # ------------------------------------------------------------------ lookup
    def queue(self, key: str) -> Queue:
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = Queue(self, key)
            if self.wildcard_queue_subs and self.queue_created is not None:
                self.queue_created(q)
        return q

    def forget_idle(self, keys: Sequence[str]) -> None:
        for key in keys:
            q = self.queues.get(key)
            if q is not None and not q.consumers and not q.messages:
                del self.queues[key]

    def topic(self, key: str) -> Topic:
        t = self.topics.get(key)
        if t is None:
            t = self.topics[key] = Topic(key)
        return t

    def new_id(self) -> str:
        return f"{self._prefix}{next(self._ids)}"

    def make_message(
        self,
        destination: str,
        headers: tuple[tuple[str, str], ...],
        body: bytes,
        persistent: bool,
        key: str,
    ) -> Message:
        expires = 0.0
        for k, v in headers:
            if k == "expires":
                try:
                    ms = int(v)
                except ValueError:
                    raise CoreError(f"expires header must be milliseconds since the epoch, got {v!r}") from None
                expires = ms / 1000.0 if ms > 0 else 0.0
                break
        return Message(
            id=self.new_id(),
            destination=destination,
            headers=headers,
            body=body,
            key=key,
            timestamp=self.clock(),
            persistent=persistent and self.store is not None,
            expires=expires,
        )

    # ------------------------------------------------------------------ store glue
    def store_ack(self, ids: Sequence[str], callback: Callback | None = None) -> None:
        if self.store is not None:
            self.store.ack(ids, callback)
        elif callback is not None:
            callback(None)

    def done(self, callback: Callback | None) -> None:
        """Run ``callback`` once everything written so far is durable (at once without a store)."""
        if callback is None:
            return
        if self.store is not None:
            self.store.journal.on_durable(callback)
        else:
            callback(None)

    def drop_expired(self, msg: Message) -> None:
        self.expired += 1
        q = self.queues.get(msg.destination)
        if q is not None:
            q.expired += 1
        self.memory.release(msg)
        if msg.persistent:
            self.store_ack([msg.id])

    def sweep_expired(self) -> int:
        """Drop expired messages still waiting in queues (run while flow control holds
        producers: a queue nobody consumes would otherwise keep them, and the memory)."""
        now = self.clock()
        dropped = 0
        for q in list(self.queues.values()):
            if not any(m.expires and m.expires <= now for m in q.messages):
                continue
            keep: deque[Message] = deque()
            for m in q.messages:
                if m.expires and m.expires <= now:
                    self.drop_expired(m)
                    dropped += 1
                else:
                    keep.append(m)
            q.messages = keep
        return dropped

    # ------------------------------------------------------------------ stats
    def _backlog_stats(self) -> dict[str, int]:
        subs = [*self.wildcard_subs, *(s for t in self.topics.values() for s in t.subs)]
        return {
            "messages": sum(len(s.backlog) for s in subs),
            "bytes": sum(s.backlog.bytes for s in subs),
            "dropped": sum(s.backlog.dropped for s in subs),
        }

    def stats(self) -> dict[str, object]:
        return {
            "queues": {
                k: {
                    "depth": len(q.messages),
                    "consumers": len(q.consumers),
                    "enqueued": q.enqueued,
                    "dequeued": q.dequeued,
                    "memory": self.memory.by_destination.get(k, 0),
                }
                for k, q in self.queues.items()
            },
            "topics": {k: len(t.subs) for k, t in self.topics.items()},
            "topic_backlog": self._backlog_stats(),
            "sent": self.sent,
            "duplicates": self.duplicates,
            "dead_lettered": self.dead_lettered,
            "expired": self.expired,
            "memory": self.memory.stats(),
        }


class FanOut:
    """Topic messages: the durable subscriptions' copies, and the live subscriptions
    (wildcards included), each with its bounded backlog while it has no credit."""

    def __init__(self, reg: Registry) -> None:
        self.reg = reg

    def publish(self, name: str, msg: Message, callback: Callback | None) -> None:
        store = self.reg.store
        copies = self.durable_copies(name, msg)
        if msg.persistent and store is not None and copies:
            key = (msg.destination, msg.key, msg.timestamp) if msg.key else None  # persisted with the copies
            store.add_many(copies, callback, key=key)
        else:
            if msg.key and store is not None:
                store.remember_key(msg.destination, msg.key)
            if callback is not None:
                callback(None)
        self.fan_out(name, msg, copies)

    def durable_copies(self, name: str, msg: Message) -> list[Message]:
        """One copy of topic message ``msg`` per durable subscription of topic ``name``."""
        topic = self.reg.topics.get(name)
        if topic is None or not topic.durable:
            return []
        return [
            Message(
                id=f"{msg.id}:{qkey}",
                destination=qkey,
                headers=(("destination", msg.destination), *msg.headers),
                body=msg.body,
                key="",
                timestamp=msg.timestamp,
                persistent=msg.persistent,
                expires=msg.expires,
            )
            for qkey in topic.durable
        ]

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
        if reg.wildcard_subs:
            parts = name.split(".")
            for sub in reg.wildcard_subs:
                assert sub.pattern is not None
                if _matches(sub.pattern, parts):
                    self.offer(sub, msg)

    def offer(self, sub: Subscription, msg: Message) -> None:
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


class Advisories:
    """Consumer advisories: ``/topic/ActiveMQ.Advisory.Consumer.Queue.X`` (header
    ``consumerCount``) whenever a queue gains or loses a consumer; a new advisory
    subscriber is told the current counts."""

    def __init__(self, reg: Registry, fanout: FanOut) -> None:
        self.reg = reg
        self.fanout = fanout

    def message(self, queue_dest: str, count: int) -> Message:
        name = queue_dest[len(QUEUE_PREFIX) :] if queue_dest.startswith(QUEUE_PREFIX) else queue_dest
        topic = f"{ADVISORY_PREFIX}{name}"
        body = json.dumps({"destination": queue_dest, "consumerCount": count}).encode()
        return Message(
            id=self.reg.new_id(),
            destination=f"{TOPIC_PREFIX}{topic}",
            headers=(
                ("consumerCount", str(count)),
                ("advisoryType", "ConsumerInfo"),
                ("originDestination", queue_dest),
                ("content-type", "application/json"),
            ),
            body=body,
            timestamp=self.reg.clock(),
        )

    def advise(self, queue_dest: str, count: int) -> None:
        reg = self.reg
        if not reg.config.advisories or not queue_dest.startswith(QUEUE_PREFIX):
            return
        name = queue_dest[len(QUEUE_PREFIX) :]
        topic = f"{ADVISORY_PREFIX}{name}"
        if topic not in reg.topics and not reg.wildcard_subs:
            return
        msg = self.message(queue_dest, count)
        self.fanout.publish(topic, msg, None)

    def advise_current(self, sub: Subscription) -> None:
        reg = self.reg
        if not reg.config.advisories:
            return
        for key, q in list(reg.queues.items()):
            if not key.startswith(QUEUE_PREFIX) or not q.consumers:
                continue
            topic_parts = f"{ADVISORY_PREFIX}{key[len(QUEUE_PREFIX):]}".split(".")
            wanted = _matches(sub.pattern, topic_parts) if sub.pattern else ".".join(topic_parts) == sub.name
            if wanted:
                self.fanout.offer(sub, self.message(key, len(q.consumers)))


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
        if "*" in name.split(".") or ">" in name.split("."):
            return False  # never a real queue; a wildcard is not read by another wildcard
        return _matches(sub.pattern, name.split("."))

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
            before = len(q.messages)
            q.make_ready(child)
            if len(q.messages) < before:
                served.append(key)
        for key in served:
            if key in sub.children:
                sub.children.move_to_end(key)


class Acks:
    """ACK and NACK, the credit they give back, redelivery and the dead-letter queue."""

    def __init__(self, reg: Registry, fanout: FanOut, wildcards: WildcardQueues) -> None:
        self.reg = reg
        self.fanout = fanout
        self.wildcards = wildcards

    def capacity_changed(self, sub: Subscription) -> None:
        """The subscription may take more (ack, nack, connection writable again)."""
        if not sub.active:
            return
        if sub.children is not None:
            self.wildcards.ready(sub)
        elif sub.kind == "queue":
            q = self.reg.queues.get(sub.name)
            if q is not None:
                q.make_ready(sub)
        else:
            self.fanout.drain(sub)

    def count_dequeued(self, sub: Subscription, msgs: Sequence[Message]) -> None:
        queues = self.reg.queues
        if sub.children is not None:  # a wildcard: each message counts for its own queue
            for m in msgs:
                q = queues.get(m.destination)
                if q is not None:
                    q.dequeued += 1
            return
        q = queues.get(sub.name)
        if q is not None:
            q.dequeued += len(msgs)

    def _take(self, sub: Subscription, msg_id: str, cumulative: bool) -> list[Message]:
        """Remove and return the messages an ACK/NACK of ``msg_id`` covers."""
        unacked = sub.unacked
        if msg_id not in unacked:
            return []
        if not cumulative:
            return [unacked.pop(msg_id)]
        out: list[Message] = []
        while unacked:
            mid, m = unacked.popitem(last=False)
            out.append(m)
            if mid == msg_id:
                break
        return out

    def ack(
        self,
        sub: Subscription,
        msg_id: str,
        *,
        tx: TxState | None = None,
        callback: Callback | None = None,
    ) -> bool:
        """ACK; False when the id was not awaiting an ack on this subscription."""

        def settle(msgs: list[Message]) -> None:
            if tx is not None:
                tx.acked.extend((sub, m) for m in msgs)
                self.reg.done(callback)
            else:
                self._consumed(sub, msgs, callback)

        return self._settle(sub, msg_id, callback, settle)

    def _settle(
        self,
        sub: Subscription,
        msg_id: str,
        callback: Callback | None,
        settle: Callable[[list[Message]], None],
    ) -> bool:
        """What ACK and NACK share: nothing to do in auto mode, False for an id not
        awaiting an ack, else ``settle`` the message(s) (``callback`` is its to call)
        and give the subscription its credit back."""
        if sub.ack_mode == AUTO:
            self.reg.done(callback)
            return True
        msgs = self._take(sub, msg_id, cumulative=sub.ack_mode == CLIENT)
        if not msgs:
            self.reg.done(callback)
            return False
        settle(msgs)
        self.capacity_changed(sub)
        return True

    def _consumed(self, sub: Subscription, msgs: Sequence[Message], callback: Callback | None) -> None:
        reg = self.reg
        for m in msgs:
            reg.memory.release(m)
        if sub.kind == "queue":
            self.count_dequeued(sub, msgs)
        ids = [m.id for m in msgs if m.persistent and sub.kind == "queue"]
        if ids:
            reg.store_ack(ids, callback)
        else:
            reg.done(callback)

    def nack(
        self,
        sub: Subscription,
        msg_id: str,
        *,
        tx: TxState | None = None,
        callback: Callback | None = None,
    ) -> bool:
        """NACK: redeliver (or DLQ) now, or at COMMIT inside a transaction."""

        def settle(msgs: list[Message]) -> None:
            if tx is not None:
                tx.nacked.extend((sub, m) for m in msgs)
            else:
                self.return_unacked(sub, msgs, count_failure=True)
            self.reg.done(callback)

        return self._settle(sub, msg_id, callback, settle)

    def return_unacked(self, sub: Subscription, msgs: Sequence[Message], *, count_failure: bool) -> None:
        """Messages a consumer did not take: redeliver (front of the queue) or DLQ."""
        if not msgs:
            return
        if sub.kind != "queue":
            if sub.active:  # a NACK on a live topic subscription: offer it again
                for m in msgs:
                    sub.backlog.appendleft(m)
                self.fanout.drain(sub)
            return
        reg = self.reg
        limit = reg.config.max_redeliveries
        back: list[Message] = []
        for m in msgs:
            if limit >= 0 and m.delivery_count > limit and count_failure and not reg.shutting_down:
                self._dead_letter(m)
            else:
                back.append(m)
        if back:
            if sub.durable_queue is not None and sub.durable_queue not in reg.durable_subs:
                for m in back:
                    reg.memory.release(m)
                reg.store_ack([m.id for m in back if m.persistent])  # its subscription is gone
                return
            if sub.children is not None:  # a wildcard: each message to its own queue
                by_queue: dict[str, list[Message]] = {}
                for m in back:
                    by_queue.setdefault(m.destination, []).append(m)
                for key, ms in by_queue.items():
                    reg.queue(key).requeue(ms)
                return
            reg.queue(sub.name).requeue(back)  # re-created if it was forgotten meanwhile

    def _dead_letter(self, m: Message) -> None:
        reg = self.reg
        src = m.destination
        name = dead_letter_name(src)
        reg.dead_lettered += 1
        reg.memory.release(m)  # charged again to the DLQ by enqueue (or gone)
        if name.startswith(reg.config.dlq_prefix):
            log.warning("message %s exceeded redeliveries in dead-letter queue %s; discarded", m.id, src)
            if m.persistent:
                reg.store_ack([m.id])
            return
        dlq = f"{QUEUE_PREFIX}{reg.config.dlq_prefix}{name}"
        log.info("message %s delivered %d times: moved to %s", m.id, m.delivery_count, dlq)
        self.move_message(m, dlq)

    def move_message(self, m: Message, target: str) -> None:
        """Put message ``m``, which the caller took off its queue (or out of a consumer's
        hands), on queue ``target``: a journalled ``Move`` for a persistent message; it
        keeps (or gains) its ``original-destination`` header and its delivery count
        starts again. Used by dead-lettering and by the operator's move/retry."""
        reg = self.reg
        src = m.destination
        reg.memory.release(m)  # charged again to the target by enqueue
        if m.persistent and reg.store is not None:
            reg.store.move(m.id, target)  # sets m.destination, adds original-destination
        if m.destination != target:  # not in the store (non-persistent)
            if not any(k == "original-destination" for k, _ in m.headers):
                m.headers = (*m.headers, ("original-destination", src))
            m.destination = target
        m.wire_cache = None
        m.delivery_count = 0
        reg.queue(target).enqueue(m)


class Transactions:
    """BEGIN .. COMMIT/ABORT: sends held until COMMIT, acks and nacks applied at COMMIT,
    everything a COMMIT does written as one atomic journal record."""

    def __init__(self, reg: Registry, fanout: FanOut, acks: Acks) -> None:
        self.reg = reg
        self.fanout = fanout
        self.acks = acks

    def tx_send(
        self,
        tx: TxState,
        destination: str,
        headers: tuple[tuple[str, str], ...],
        body: bytes,
        *,
        persistent: bool,
        key: str = "",
    ) -> None:
        """Hold a SEND until ``tx`` commits; its bytes count against the memory limits
        meanwhile, and a transaction may hold at most ``max_transaction_size`` bytes."""
        check_send_destination(destination)
        size = send_size(headers, body)
        limit = self.reg.config.max_transaction_size
        if tx.size + size > limit:
            raise CoreError(
                f"transaction {tx.id!r} would hold {tx.size + size} bytes of messages, over "
                f"max_transaction_size={limit}: send refused, the transaction is rolled back "
                "(commit in smaller transactions)"
            )
        tx.sends.append(TxSend(destination, headers, body, persistent, key, size))
        tx.size += size
        self.reg.memory.reserve(destination, size)

    def commit(self, tx: TxState, callback: Callback | None = None) -> None:
        """Apply a transaction: everything it does -- queue messages, the durable
        subscribers' copies of its topic messages, their idempotency keys, its acks -- in
        one atomic journal record; ``callback`` runs once that record is durable."""
        reg = self.reg
        records: list[TxPart] = []
        routed: list[tuple[str, str, Message, list[Message]]] = []
        memory_keys: list[tuple[str, str]] = []  # keys of messages that are not persisted
        seen_keys: set[tuple[str, str]] = set()
        store = reg.store
        duplicates = 0
        for destination, headers, body, persistent, key, _size in tx.sends:
            kind, name = check_send_destination(destination)
            if key and (
                (store is not None and store.is_duplicate(destination, key)) or (destination, key) in seen_keys
            ):
                duplicates += 1
                continue
            if key:
                seen_keys.add((destination, key))
            msg = reg.make_message(destination, headers, body, persistent, key)
            copies = self.fanout.durable_copies(name, msg) if kind == "topic" else []
            if msg.persistent and kind == "queue":
                records.append(Enq(msg))
            elif msg.persistent and copies:
                records.extend(Enq(c) for c in copies)
                if key:
                    records.append(Keys(((destination, key, msg.timestamp),)))
            elif key:
                memory_keys.append((destination, key))
            routed.append((kind, name, msg, copies))
        ack_ids = [m.id for sub, m in tx.acked if sub.kind == "queue" and m.persistent]
        if ack_ids:
            records.append(Ack(tuple(ack_ids)))
        if store is not None:
            try:
                store.commit(records, callback)
            except (RecordError, JournalError) as exc:  # nothing was written
                self.abort(tx)
                if isinstance(exc, JournalError):
                    raise
                raise CoreError(f"transaction {tx.id!r} cannot be committed: {exc}") from None
            for destination, key in memory_keys:
                store.remember_key(destination, key)
        elif callback is not None:
            callback(None)
        reg.sent += len(routed)
        reg.duplicates += duplicates
        for sub, m in tx.acked:
            reg.memory.release(m)
            if sub.kind == "queue":
                self.acks.count_dequeued(sub, [m])
        for send in tx.sends:  # the messages are charged as they are enqueued below
            reg.memory.unreserve(send.destination, send.size, settle=False)
        for kind, name, msg, copies in routed:
            if kind == "queue":
                reg.queue(msg.destination).enqueue(msg)
            else:
                self.fanout.fan_out(name, msg, copies)
        reg.memory.settle({send.destination for send in tx.sends})
        for sub, m in tx.nacked:
            self.acks.return_unacked(sub, [m], count_failure=True)
        self._clear(tx)

    def abort(self, tx: TxState) -> None:
        """Drop a transaction's sends; messages it acked are redelivered."""
        by_sub: dict[int, tuple[Subscription, list[Message]]] = {}
        for sub, m in (*tx.acked, *tx.nacked):
            by_sub.setdefault(id(sub), (sub, []))[1].append(m)
        for sub, msgs in by_sub.values():
            if sub.kind == "queue":
                self.acks.return_unacked(sub, msgs, count_failure=True)
        for send in tx.sends:
            self.reg.memory.unreserve(send.destination, send.size)
        self._clear(tx)

    @staticmethod
    def _clear(tx: TxState) -> None:
        tx.sends.clear()
        tx.acked.clear()
        tx.nacked.clear()
        tx.size = 0


class BrokerCore(Registry):
    """The registry and its stories, wired together: what the protocol handler calls.

    SEND, SUBSCRIBE and UNSUBSCRIBE are here; ACK/NACK go through :attr:`acks`,
    BEGIN/COMMIT/ABORT through :attr:`transactions`."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore | None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(config, store, clock=clock)
        self.fanout = FanOut(self)
        self.advisories = Advisories(self, self.fanout)
        self.wildcards = WildcardQueues(self, self.advisories)
        self.queue_created = self.wildcards.queue_created
        self.acks = Acks(self, self.fanout, self.wildcards)
        self.transactions = Transactions(self, self.fanout, self.acks)

    def capacity_changed(self, sub: Subscription) -> None:
        """The subscription may take more (its connection is writable again)."""
        self.acks.capacity_changed(sub)

    # ------------------------------------------------------------------ sending
    def send(
        self,
        destination: str,
        headers: tuple[tuple[str, str], ...],
        body: bytes,
        *,
        persistent: bool,
        key: str = "",
        callback: Callback | None = None,
    ) -> bool:
        """Accept a SEND. Returns False for a suppressed duplicate.

        ``callback`` runs when the message (or, for a duplicate, the original) is
        durable; for a non-persistent message, at once (on the journal's order).
        """
        kind, name = check_send_destination(destination)
        if key and self.store is not None and self.store.is_duplicate(destination, key, callback):
            self.duplicates += 1
            return False
        msg = self.make_message(destination, headers, body, persistent, key)
        try:
            if kind == "queue":
                if msg.persistent:
                    assert self.store is not None
                    self.store.add(msg, callback)
                else:
                    if key and self.store is not None:
                        self.store.remember_key(destination, key)
                    if callback is not None:
                        callback(None)
                self.queue(destination).enqueue(msg)
            else:
                self.fanout.publish(name, msg, callback)
        except RecordError as exc:  # nothing was written or routed
            raise CoreError(f"message refused: {exc}") from None
        self.sent += 1
        return True

    # ------------------------------------------------------------------ subscriptions
    def subscribe(
        self,
        conn: Sink,
        sub_id: str,
        destination: str,
        *,
        ack_mode: str = AUTO,
        prefetch: int | None = None,
        durable_name: str | None = None,
        client_id: str | None = None,
    ) -> Subscription:
        if ack_mode not in ACK_MODES:
            raise CoreError(f"ack mode {ack_mode!r} is not one of {', '.join(ACK_MODES)}")
        kind, name = split_destination(destination)
        sub = Subscription(conn, sub_id, destination, ack_mode, prefetch or self.config.default_prefetch)
        if kind == "queue":
            sub.name = destination
            qpattern = _pattern(name)
            if qpattern is not None:
                self.wildcards.add(sub, qpattern)
                return sub
            q = self.queue(destination)
            q.add_consumer(sub)
            self.advisories.advise(destination, len(q.consumers))
            return sub
        if durable_name:
            if not client_id:
                raise CoreError("a durable subscription needs a client-id header on CONNECT")
            qkey = f"{DURABLE_PREFIX}{client_id}:{durable_name}"
            if qkey in self.durable_active:
                raise CoreError(f"durable subscription {durable_name!r} of client {client_id!r} is already active")
            record = Sub(qkey, name, client_id, durable_name)
            existing = self.durable_subs.get(qkey)
            if existing is not None and existing.topic != name:
                self._destroy_durable(qkey)  # re-subscribed to another topic: start over
                existing = None
            if existing is None:
                if self.store is not None:
                    self.store.add_subscription(record)
                self.register_durable(record)
            sub.durable_queue = qkey
            sub.name = qkey
            sub.kind = "queue"
            self.durable_active[qkey] = sub
            self.queue(qkey).add_consumer(sub)
            return sub
        sub.name = name
        pattern = _pattern(name)
        if pattern is not None:
            sub.pattern = pattern
            self.wildcard_subs.append(sub)
        else:
            self.topic(name).subs.append(sub)
        if name.startswith(ADVISORY_PREFIX) or (pattern is not None and "ActiveMQ" in name):
            self.advisories.advise_current(sub)
        return sub

    def unsubscribe(self, sub: Subscription, *, destroy_durable: bool = False) -> None:
        """Detach a subscription; its unacked messages are redelivered to others."""
        if not sub.active:
            return
        sub.active = False
        if sub.kind == "queue" and sub.children is not None:
            keys = list(sub.children)
            self.wildcards.detach_all(sub)
            self.acks.return_unacked(sub, list(sub.unacked.values()), count_failure=True)
            sub.unacked.clear()
            self.forget_idle(keys)
        elif sub.kind == "queue":
            q = self.queues.get(sub.name)
            if q is not None:
                q.remove_consumer(sub)
            if sub.durable_queue is not None:
                self.durable_active.pop(sub.durable_queue, None)
            self.acks.return_unacked(sub, list(sub.unacked.values()), count_failure=True)
            sub.unacked.clear()
            if sub.durable_queue is not None and destroy_durable:
                self._destroy_durable(sub.durable_queue)
            elif q is not None and sub.durable_queue is None:
                self.advisories.advise(sub.name, len(q.consumers))
                if not q.consumers and not q.messages:
                    del self.queues[sub.name]  # nothing to keep: unique names must not leak
        else:
            if sub.pattern is not None:
                if sub in self.wildcard_subs:
                    self.wildcard_subs.remove(sub)
            else:
                t = self.topics.get(sub.name)
                if t is not None and sub in t.subs:
                    t.subs.remove(sub)
                    if not t.subs and not t.durable:
                        del self.topics[sub.name]
            sub.unacked.clear()
            sub.backlog.clear()

    def destroy_durable(self, client_id: str, name: str) -> bool:
        qkey = f"{DURABLE_PREFIX}{client_id}:{name}"
        if qkey not in self.durable_subs:
            return False
        active = self.durable_active.get(qkey)
        if active is not None:
            self.unsubscribe(active, destroy_durable=True)
        else:
            self._destroy_durable(qkey)
        return True

    def _destroy_durable(self, qkey: str) -> None:
        record = self.durable_subs.pop(qkey, None)
        if record is None:
            return
        t = self.topics.get(record.topic)
        if t is not None:
            t.durable.pop(qkey, None)
        q = self.queues.pop(qkey, None)
        if q is not None:
            self.memory.release_all(list(q.messages))
            ids = [m.id for m in q.messages if m.persistent]
            if ids:
                self.store_ack(ids)
        if self.store is not None:
            self.store.remove_subscription(qkey)
