"""The core's data: subscriptions (and the :class:`Sink` they deliver to), topics,
transactions and the ack modes."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from amqtransport.destinations import QUEUE_PREFIX, TEMP_QUEUE_PREFIX
from amqtransport.selector import Selector

from .backlog import TopicBacklog
from .message import Message

__all__ = ["ACK_MODES", "AUTO", "CLIENT", "INDIVIDUAL", "Sink", "Subscription", "Topic", "TxSend", "TxState"]

AUTO, CLIENT, INDIVIDUAL = "auto", "client", "client-individual"
ACK_MODES = (AUTO, CLIENT, INDIVIDUAL)


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
        "selector",
        "no_local",
        "exclusive",
        "consumer_priority",
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
        self.selector: Selector | None = None  # the SUBSCRIBE's JMS selector (selection.py)
        self.no_local = ""  # activemq.noLocal: its connection's session id (messages from it are not for it)
        self.exclusive = False  # activemq.exclusive (consumers.py)
        self.consumer_priority = 0  # activemq.priority (consumers.py)

    def has_credit(self) -> bool:
        if not self.active or not self.conn.writable:
            return False
        return self.ack_mode == AUTO or len(self.unacked) < self.prefetch

    def __repr__(self) -> str:
        return f"<Subscription {self.id} {self.destination} {self.ack_mode}>"


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
    origin: str = ""  # the session id of its connection (Message.origin)
