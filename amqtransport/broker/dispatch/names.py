"""The broker's names: the destinations clients give (parsed by the one grammar,
:mod:`amqtransport.destinations`, and mapped to :class:`~.errors.CoreError` for the
ERROR frame), what a SEND may name, and the internal names of durable subscriptions
and of dead-letter queues.
"""

from __future__ import annotations

from collections.abc import Sequence

from amqtransport.destinations import QUEUE, QUEUE_PREFIX, parse_destination, wildcard_segments
from amqtransport.errors import DestinationError

from .errors import CoreError

__all__ = [
    "check_send_destination",
    "destination_key",
    "dead_letter_name",
    "split_destination",
    "DURABLE_PREFIX",
]

DURABLE_PREFIX = "durable:"


_SPLIT_CACHE: dict[str, tuple[str, str]] = {}


def split_destination(destination: str) -> tuple[str, str]:
    """``("queue"|"topic", name)``; CoreError for anything else."""
    hit = _SPLIT_CACHE.get(destination)
    if hit is not None:
        return hit
    if len(_SPLIT_CACHE) > 10000:
        _SPLIT_CACHE.clear()
    try:
        dest = parse_destination(destination)
    except DestinationError as exc:
        raise CoreError(str(exc)) from None
    _SPLIT_CACHE[destination] = hit = (dest.kind, dest.name)
    return hit


def check_send_destination(destination: str) -> tuple[str, str]:
    """:func:`split_destination` for a SEND: a wildcard queue is refused (it names
    many queues, or none; ActiveMQ semantics are for consumers)."""
    kind, name = split_destination(destination)
    if kind == QUEUE and ("*" in name or ">" in name) and wildcard_segments(name) is not None:
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


def destination_key(name: str, queues: Sequence[str] | None = None) -> str:
    """The core's key for a queue ``name`` as URLs carry it: ``orders`` -> ``/queue/orders``;
    a key that is already whole (``/temp-queue/x``, ``durable:c:s``) stays as it is."""
    if name.startswith("/"):
        return name
    if name.startswith(DURABLE_PREFIX) and (queues is None or QUEUE_PREFIX + name not in queues):
        return name
    return QUEUE_PREFIX + name
