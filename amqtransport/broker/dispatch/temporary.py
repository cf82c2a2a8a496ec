"""Temporary destinations: ``/temp-queue/NAME`` and ``/temp-topic/NAME``, scoped to the
connection that names them, as ActiveMQ 5.17's STOMP connector scopes them.

Theory of operation
-------------------
A client's ``/temp-queue/replies`` is its own: the first time a connection names it
(SUBSCRIBE, SEND, or a ``reply-to`` header), the broker creates a destination with a
name of its own, ``ID:<session>:<n>`` (the connection's session id and a sequence
number, ActiveMQ's form), and records the connection as its owner here. The core
knows it under that name (a queue keyed ``/temp-queue/ID:s:1``, a topic keyed
``/temp-topic/ID:s:1``: never the key of an ordinary destination, and never matched
by a wildcard subscription). The connection keeps the mapping both ways
(``connection/temporary.py``): what it sends and subscribes to by its name goes to
that destination, and what it receives from it shows its name again.

Other connections know it only as ``/remote-temp-queue/ID:s:1`` (or
``/remote-temp-topic/...``): that is what a ``reply-to:/temp-queue/replies`` becomes
on the way in, so whoever receives the request replies to the remote name, and the
reply reaches the owner under its own name. Anyone may SEND to a remote name that
exists; only its owner may read it (ActiveMQ 5.17 lets another STOMP connection
subscribe and share the messages; its JMS client refuses: we refuse on the broker).

A temporary destination holds no persistent message (as ActiveMQ's, it has no message
store: a persistent SEND to it is kept in memory), so nothing of it is journaled,
replicated or recovered: it is gone when its connection goes, or when the broker
does. A SEND to a remote name whose owner is gone is refused with ActiveMQ's words
(``The destination temp-queue://ID:... does not exist``), and the sender's connection
stays. After a failover the client's connection is a new one: its temporary
destinations are created afresh under new names (see docs/client.md, request/reply).
"""

from __future__ import annotations

from amqtransport.destinations import (
    QUEUE,
    REMOTE_TEMP_QUEUE_PREFIX,
    REMOTE_TEMP_TOPIC_PREFIX,
    TEMP_QUEUE_PREFIX,
    TEMP_TOPIC_PREFIX,
)

from .errors import CoreError

__all__ = ["TempDestinations", "is_temporary_key", "remote_name", "temporary_key"]

_REMOTE_TO_KEY = ((REMOTE_TEMP_QUEUE_PREFIX, TEMP_QUEUE_PREFIX), (REMOTE_TEMP_TOPIC_PREFIX, TEMP_TOPIC_PREFIX))
_URI_FORM = {TEMP_QUEUE_PREFIX: "temp-queue://", TEMP_TOPIC_PREFIX: "temp-topic://"}


def is_temporary_key(key: str) -> bool:
    """Whether ``key`` (a core destination) is a temporary destination."""
    return key.startswith((TEMP_QUEUE_PREFIX, TEMP_TOPIC_PREFIX))


def temporary_key(remote: str) -> str | None:
    """The core key of a remote name (``/remote-temp-queue/ID:s:1`` ->
    ``/temp-queue/ID:s:1``), or None when ``remote`` is not one."""
    for remote_prefix, key_prefix in _REMOTE_TO_KEY:
        if remote.startswith(remote_prefix) and len(remote) > len(remote_prefix):
            return key_prefix + remote[len(remote_prefix):]
    return None


def remote_name(key: str) -> str:
    """What other connections call temporary destination ``key``."""
    for remote_prefix, key_prefix in _REMOTE_TO_KEY:
        if key.startswith(key_prefix):
            return remote_prefix + key[len(key_prefix):]
    raise ValueError(f"{key!r} is not a temporary destination")


class TempDestinations:
    """Which connection (session id) owns each temporary destination (module docstring)."""

    def __init__(self) -> None:
        self._owners: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._owners)

    def create(self, session: str, kind: str, seq: int) -> str:
        """A new temporary destination of ``session`` (``kind`` queue or topic, its
        ``seq``-th): its core key."""
        key = f"{TEMP_QUEUE_PREFIX if kind == QUEUE else TEMP_TOPIC_PREFIX}ID:{session}:{seq}"
        self._owners[key] = session
        return key

    def owner(self, key: str) -> str | None:
        return self._owners.get(key)

    def check(self, key: str, session: str, *, reading: bool) -> None:
        """A connection (``session``) names temporary destination ``key`` by its remote
        name: CoreError unless it exists and, to read it, unless it is the owner."""
        owner = self._owners.get(key)
        uri = next(u for p, u in _URI_FORM.items() if key.startswith(p)) + key.split("/", 2)[2]
        if owner is None:
            raise CoreError(f"The destination {uri} does not exist (its connection has closed)")
        if reading and owner != session:
            raise CoreError(f"{remote_name(key)} is a temporary destination of another connection: "
                            "only the connection that created it may subscribe to it (anyone may send to it)")

    def release(self, keys: list[str]) -> None:
        """Their connection is gone: they no longer exist."""
        for key in keys:
            self._owners.pop(key, None)
