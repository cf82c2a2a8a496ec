"""The duplicate-suppression window: (destination, idempotency key) -> when it was accepted.

Keys are scoped per destination (as Artemis scopes its duplicate-ID cache per
address): the same key sent to ``/queue/a`` and to ``/queue/b`` is two messages; a
repeat to the same destination is a duplicate. The scope is the destination the
producer sent to (``/queue/X``, ``/topic/X``). Entries read from journals written
before keys were scoped have the scope ``""``, which matches every destination (the
old, broker-global meaning) until they age out of the window.

Bounded two ways: at most ``max_keys`` keys (the oldest go first) and no key older than
``max_age`` seconds. Insertion order is acceptance order, so both bounds are enforced
by popping from the front of an ordered dict: O(1) amortised per key, no scans.

Each entry also remembers the journal segment whose record currently carries it
(``-1``: not on disk, e.g. a non-persistent message), so compaction can carry the
keys of a segment it deletes forward into the head segment and a restart still
drops repeats.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator

__all__ = ["DedupeWindow", "ANY_DESTINATION"]

#: the scope of keys from journals written before keys were scoped: every destination
ANY_DESTINATION = ""


class DedupeWindow:
    def __init__(
        self,
        max_keys: int = 100_000,
        max_age: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_keys < 0 or max_age < 0:
            raise ValueError("dedupe window bounds must be >= 0")
        self.max_keys = max_keys
        self.max_age = max_age
        self.clock = clock
        self._keys: OrderedDict[tuple[str, str], tuple[float, int]] = OrderedDict()
        self._unscoped = False  # an ANY_DESTINATION entry was ever added
        self.dropped = 0  # duplicates suppressed (statistics)

    def __len__(self) -> int:
        return len(self._keys)

    def _find(self, scope: str, key: str) -> tuple[str, str] | None:
        entry = (scope, key)
        if entry in self._keys:
            return entry
        if self._unscoped and (ANY_DESTINATION, key) in self._keys:
            return (ANY_DESTINATION, key)
        return None

    def contains(self, scope: str, key: str) -> bool:
        """Was ``key`` accepted for destination ``scope`` within the window?"""
        if self._find(scope, key) is None:
            return False
        self.expire()
        return self._find(scope, key) is not None

    def add(self, scope: str, key: str, accepted_at: float, segment: int = -1) -> None:
        """Remember ``key`` for ``scope`` (re-adding moves it to the end with the new segment)."""
        if self.max_keys == 0:
            return
        entry = (scope, key)
        if scope == ANY_DESTINATION:
            self._unscoped = True
        if entry in self._keys:
            del self._keys[entry]
        self._keys[entry] = (accepted_at, segment)
        self.expire()

    def expire(self) -> None:
        keys = self._keys
        while len(keys) > self.max_keys:
            keys.popitem(last=False)
        if keys and self.max_age:
            horizon = self.clock() - self.max_age
            while keys:
                first = next(iter(keys.values()))
                if first[0] >= horizon:
                    break
                keys.popitem(last=False)

    def in_segments(self, segments: set[int]) -> list[tuple[str, str, float]]:
        """Live ``(scope, key, accepted_at)`` entries carried by one of ``segments`` (for compaction)."""
        self.expire()
        return [(scope, k, ts) for (scope, k), (ts, seg) in self._keys.items() if seg in segments]

    def items(self) -> Iterator[tuple[str, str, float, int]]:
        """``(scope, key, accepted_at, segment)`` of every live entry, oldest first."""
        self.expire()
        for (scope, k), (ts, seg) in self._keys.items():
            yield scope, k, ts, seg
