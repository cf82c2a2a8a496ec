"""The broker's destination names: ``/queue/X``, ``/topic/X`` (and their ``/temp-``
forms), the ``.``-separated segments and the ``*`` and ``>`` wildcards, the internal
names of durable subscriptions and of dead-letter queues.
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import CoreError

__all__ = [
    "check_send_destination",
    "dead_letter_name",
    "split_destination",
    "ADVISORY_PREFIX",
    "DURABLE_PREFIX",
    "QUEUE_PREFIX",
    "TEMP_QUEUE_PREFIX",
    "TEMP_TOPIC_PREFIX",
    "TOPIC_PREFIX",
]

QUEUE_PREFIX = "/queue/"
TOPIC_PREFIX = "/topic/"
TEMP_QUEUE_PREFIX = "/temp-queue/"
TEMP_TOPIC_PREFIX = "/temp-topic/"
ADVISORY_PREFIX = "ActiveMQ.Advisory.Consumer.Queue."
DURABLE_PREFIX = "durable:"


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
