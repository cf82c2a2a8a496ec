"""The broker's in-memory message: what the store persists and the dispatch core routes.

A :class:`Message` is created once per accepted SEND (or once per durable-subscription
copy of a topic message) and lives until it is acknowledged, expires or is dropped.
``headers`` are the producer's headers minus the transport-only ones (``receipt``,
``transaction``, ``content-length``); the broker adds ``message-id``, ``destination``,
``subscription``, ``ack``, ``redelivered`` and ``amq-delivery-count`` at delivery.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Message", "TRANSPORT_HEADERS"]

#: headers of a SEND that belong to the frame, not to the message
TRANSPORT_HEADERS = frozenset(
    {"receipt", "transaction", "content-length", "destination", "message-id"}
)


@dataclass(slots=True, eq=False)
class Message:
    """One message. ``id`` is unique in the broker (and across restarts)."""

    id: str
    destination: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    key: str = ""  # idempotency key ("" when the producer gave none)
    timestamp: float = 0.0  # wall-clock seconds when accepted
    persistent: bool = False
    expires: float = 0.0  # wall-clock seconds, 0 = never
    delivery_count: int = 0  # how many times it has been handed to a consumer
    #: store bookkeeping: the journal segment holding the ENQ record (-1: not on disk)
    segment: int = -1
    #: store bookkeeping: the ENQ record's position with its flags (see store/pages.py; 0: none)
    pos: int = 0
    #: bytes charged to the memory gauge while the message is live (0: not charged)
    mem: int = 0
    #: cache of the wire header block shared by every delivery (built by the protocol layer)
    wire_cache: object = field(default=None, repr=False)
    #: its place in its queue's order (set as it becomes resident; see selection.py)
    seq: int = 0
    #: cache of what a selector sees of it (built by selection.py on first use)
    view: object = field(default=None, repr=False)
    #: the session id of the connection that sent it (``activemq.noLocal``; not persisted)
    origin: str = ""
    #: its JMS priority, 0-9 (priority.py reads it from the headers; -1: not read yet)
    priority: int = -1
    #: its JMSXGroupID ("" none; None: not read yet; see consumers.py)
    group: str | None = None

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 1
