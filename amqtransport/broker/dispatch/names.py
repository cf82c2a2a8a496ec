"""The broker's names: the destinations clients give (parsed by the one grammar,
:mod:`amqtransport.destinations`, and mapped to :class:`~.errors.CoreError` for the
ERROR frame), what a SEND may name, and the internal names of durable subscriptions
and of dead-letter queues.

Composite destinations (ActiveMQ): a SEND to ``/queue/a,/topic/b`` goes to each of
the comma-separated destinations (:func:`composite_parts`); each copy carries
``original-destination`` spelled as ActiveMQ 5.17 spells the composite
(:func:`composite_name`: ``/queue/a,topic://b``, the first part's kind, then each
further part in URI form).
"""

from __future__ import annotations

from collections.abc import Sequence

from amqtransport.destinations import QUEUE, QUEUE_PREFIX, parse_destination, wildcard_segments
from amqtransport.errors import DestinationError

from .errors import CoreError

__all__ = [
    "check_send_destination",
    "composite_name",
    "composite_parts",
    "send_targets",
    "destination_key",
    "dead_letter_name",
    "split_destination",
    "DURABLE_PREFIX",
]

DURABLE_PREFIX = "durable:"


_SPLIT_CACHE: dict[str, tuple[str, str]] = {}


def split_destination(destination: str) -> tuple[str, str]:
    """``("queue"|"topic", name)``; CoreError for anything else. A temporary topic's
    name is the whole key (``/temp-topic/ID:s:1``: the registry's topics are keyed by
    name, and no ordinary topic has that one; see temporary.py)."""
    hit = _SPLIT_CACHE.get(destination)
    if hit is not None:
        return hit
    if len(_SPLIT_CACHE) > 10000:
        _SPLIT_CACHE.clear()
    try:
        dest = parse_destination(destination)
    except DestinationError as exc:
        raise CoreError(str(exc)) from None
    _SPLIT_CACHE[destination] = hit = (dest.kind, destination if dest.temporary and dest.is_topic else dest.name)
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


def composite_parts(destination: str) -> list[str] | None:
    """The destinations of a composite ``destination`` (``/queue/a,/topic/b`` ->
    ``['/queue/a', '/topic/b']``), each checked as a SEND destination; None when it is
    not a composite. As ActiveMQ 5.17's STOMP connector reads it: trailing commas are
    dropped (``/queue/a,`` is ``/queue/a``), a part named twice counts once, and a part
    without a prefix has the first part's kind (``/queue/a,b`` is ``/queue/a`` and
    ``/queue/b``)."""
    if "," not in destination:
        return None
    raw = destination.strip().split(",")
    while raw and not raw[-1]:
        raw.pop()
    if not raw:
        raise CoreError(f"destination {destination!r} names no destination")
    first = raw[0]
    kind_prefix = first[: first.index("/", 1) + 1] if first.startswith("/") and "/" in first[1:] else ""
    parts: list[str] = []
    for part in raw:
        if not part:
            raise CoreError(f"composite destination {destination!r} has an empty part")
        if not part.startswith("/") and kind_prefix and part is not first:
            part = kind_prefix + part
        check_send_destination(part)
        if part not in parts:
            parts.append(part)
    return parts


def composite_name(parts: Sequence[str]) -> str:
    """ActiveMQ's STOMP spelling of a composite (its ``original-destination``)."""
    first, *rest = parts
    kinds = {"/temp-queue/": "temp-queue://", "/temp-topic/": "temp-topic://", "/queue/": "queue://",
             "/topic/": "topic://"}
    out = [first]
    for part in rest:
        for prefix, uri in kinds.items():
            if part.startswith(prefix):
                out.append(uri + part[len(prefix):])
                break
    return ",".join(out)


Headers = tuple[tuple[str, str], ...]


def send_targets(destination: str, headers: Headers) -> list[tuple[str, Headers]]:
    """Where a SEND goes: ``[(destination, headers)]``, or for a composite one entry per
    part, its headers with ``original-destination`` (replacing the producer's)."""
    parts = composite_parts(destination)
    if parts is None or len(parts) == 1:  # one destination (``/queue/a,`` too)
        one = destination if parts is None else parts[0]
        check_send_destination(one)
        return [(one, headers)]
    original = ("original-destination", composite_name(parts))
    kept = tuple(h for h in headers if h[0] != "original-destination")
    return [(part, (*kept, original)) for part in parts]


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
