"""One connection's names for its temporary destinations (the broker's side of
``/temp-queue/NAME``, ``/temp-topic/NAME`` and ``/remote-temp-...``).

The rules are in :mod:`..dispatch.temporary`; this is the translation at the wire, in
both directions, for one connection:

- in: a destination it names (SEND, SUBSCRIBE, each part of a composite) is
  :meth:`TempNames.resolve`\\ d to the core's key: its own ``/temp-queue/x`` to the
  destination created for it (created on first use), a remote name to the other
  connection's one (which must exist; only the owner may read it); a ``reply-to``
  header naming its own temporary destination becomes the remote name
  (:meth:`TempNames.reply_to`), as ActiveMQ 5.17 rewrites it; any other header is left
  alone.
- out: the ``destination`` of a MESSAGE from one of its temporary destinations shows
  the name it gave (:meth:`TempNames.wire_name`).

:meth:`TempNames.release` drops them all when the connection ends.
"""

from __future__ import annotations

from collections.abc import Callable

from amqtransport.destinations import QUEUE, TEMP_QUEUE_PREFIX, TEMP_TOPIC_PREFIX, TOPIC

from ..dispatch.core import BrokerCore
from ..dispatch.temporary import is_temporary_key, remote_name, temporary_key

__all__ = ["TempNames"]

_TEMP_PREFIXES = (TEMP_QUEUE_PREFIX, TEMP_TOPIC_PREFIX)


class TempNames:
    """The temporary destinations of one connection (module docstring). ``session``
    gives the connection's session id (known once it is connected)."""

    def __init__(self, core: BrokerCore, session: Callable[[], str]) -> None:
        self._core = core
        self._session = session
        self._keys: dict[str, str] = {}  # its name (/temp-queue/x) -> the core's key
        self._names: dict[str, str] = {}  # the core's key -> its name

    def resolve(self, destination: str, *, reading: bool) -> tuple[str, bool]:
        """``(core key, temporary)`` of ``destination`` as this connection names it;
        CoreError for a remote name that does not exist, or that it may not read."""
        if "," in destination:  # a composite: each part (dispatch/names.py)
            parts = [self.resolve(part, reading=reading) for part in destination.split(",")]
            return ",".join(p for p, _ in parts), any(t for _, t in parts)
        if destination.startswith(_TEMP_PREFIXES) and destination not in _TEMP_PREFIXES:
            return self._own(destination), True
        key = temporary_key(destination)
        if key is None:
            return destination, False
        if self._names.get(key) is None:
            self._core.temporaries.check(key, self._session(), reading=reading)
        return key, True

    def reply_to(self, value: str) -> str:
        """A ``reply-to`` header on the way in: its own temporary name becomes the remote
        name (the destination is created if it was not yet)."""
        if value.startswith(_TEMP_PREFIXES) and value not in _TEMP_PREFIXES and "," not in value:
            return remote_name(self._own(value))
        return value

    def wire_name(self, key: str) -> str:
        """What this connection calls core destination ``key``."""
        name = self._names.get(key)
        if name is not None:
            return name
        return remote_name(key) if is_temporary_key(key) else key

    def _own(self, name: str) -> str:
        key = self._keys.get(name)
        if key is None:
            kind = QUEUE if name.startswith(TEMP_QUEUE_PREFIX) else TOPIC
            key = self._core.temporaries.create(self._session(), kind, len(self._keys) + 1)
            self._keys[name] = key
            self._names[key] = name
        return key

    def owned(self) -> list[str]:
        return list(self._names)

    def release(self) -> None:
        """The connection is gone: its temporary destinations go with it."""
        if self._names:
            keys = list(self._names)
            self._keys.clear()
            self._names.clear()
            self._core.drop_temporaries(keys)
