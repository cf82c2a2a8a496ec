"""The duplicate-suppression window: (destination, idempotency key) -> when it was accepted.

Keys are scoped per destination (as Artemis scopes its duplicate-ID cache per
address): the same key sent to ``/queue/a`` and to ``/queue/b`` is two messages; a
repeat to the same destination is a duplicate. The scope is the destination the
producer sent to (``/queue/X``, ``/topic/X``). Entries read from journals written
before keys were scoped have the scope ``""``, which matches every destination (the
old, broker-global meaning) until they age out of the window.

Bounded two ways: at most ``max_keys`` keys (the oldest go first) and no key older than
``max_age`` seconds, "oldest" meaning accepted first. Records do not always arrive in
acceptance order -- compaction re-writes the keys of a segment it deletes into the head
segment, relocation re-writes old messages, a replica's snapshot lists keys before
messages -- so the window keeps its entries in a heap ordered by acceptance time
(lazy deletion: an entry re-added with another time leaves a stale heap item that is
skipped when it surfaces); re-adding a key with the same acceptance time only moves
it to its new segment. O(log n) per new key, no scans.

Each entry also remembers the journal segment whose record currently carries it
(``-1``: not on disk, e.g. a non-persistent message), so compaction can carry the
keys of a segment it deletes forward into the head segment and a restart still
drops repeats.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Collection, Iterator

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
        # (scope, key) -> (accepted_at, segment, serial); the heap holds (accepted_at, serial, entry)
        self._keys: dict[tuple[str, str], tuple[float, int, int]] = {}
        self._order: list[tuple[float, int, tuple[str, str]]] = []
        self._serial = itertools.count()
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
        """Remember ``key`` for ``scope``, in its place by ``accepted_at``, carried by ``segment``."""
        if self.max_keys == 0:
            return
        entry = (scope, key)
        if scope == ANY_DESTINATION:
            self._unscoped = True
        old = self._keys.get(entry)
        if old is not None and old[0] == accepted_at:
            self._keys[entry] = (accepted_at, segment, old[2])  # the same key moved to another record
            return
        serial = next(self._serial)
        self._keys[entry] = (accepted_at, segment, serial)
        heapq.heappush(self._order, (accepted_at, serial, entry))
        if len(self._order) > 2 * len(self._keys) + 1024:
            self._rebuild()
        self.expire()

    def _rebuild(self) -> None:
        """Drop the heap's stale items (keys re-added with another acceptance time)."""
        self._order = [(ts, serial, e) for e, (ts, _seg, serial) in self._keys.items()]
        heapq.heapify(self._order)

    def _pop(self) -> None:
        """Pop the heap's first item and forget its key unless the item is stale."""
        _ts, serial, entry = heapq.heappop(self._order)
        live = self._keys.get(entry)
        if live is not None and live[2] == serial:
            del self._keys[entry]

    def expire(self) -> None:
        keys, order = self._keys, self._order
        while len(keys) > self.max_keys:
            self._pop()
        if keys and self.max_age:
            horizon = self.clock() - self.max_age
            while order and order[0][0] < horizon:
                self._pop()

    def in_segments(self, segments: set[int]) -> list[tuple[str, str, float]]:
        """Live ``(scope, key, accepted_at)`` entries carried by one of ``segments`` (for compaction)."""
        self.expire()
        return [(scope, k, ts) for (scope, k), (ts, seg, _n) in self._keys.items() if seg in segments]

    def bytes_in_segments(self, segments: Collection[int]) -> dict[int, int]:
        """About how many bytes the live keys carried by each of ``segments`` take in a
        ``Keys`` record (scope, key, a timestamp and framing), by segment."""
        self.expire()
        wanted = set(segments)
        out: dict[int, int] = {}
        for (scope, k), (_ts, seg, _n) in self._keys.items():
            if seg in wanted:
                out[seg] = out.get(seg, 0) + len(scope) + len(k) + 16
        return out

    def copy_entries(self) -> dict[tuple[str, str], tuple[float, int, int]]:
        """A shallow copy of the entries, ``(scope, key) -> (accepted_at, segment, serial)``
        (cheap: for a checkpoint taken on the loop and written on another thread)."""
        return dict(self._keys)

    def items(self) -> Iterator[tuple[str, str, float, int]]:
        """``(scope, key, accepted_at, segment)`` of every live entry, oldest first."""
        self.expire()
        for (scope, k), (ts, seg, _n) in sorted(self._keys.items(), key=lambda kv: kv[1][0]):
            yield scope, k, ts, seg
