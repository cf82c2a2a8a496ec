"""The duplicate-suppression window: idempotency key -> when it was accepted.

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

__all__ = ["DedupeWindow"]


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
        self._keys: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self.dropped = 0  # duplicates suppressed (statistics)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        if key not in self._keys:
            return False
        self.expire()
        return key in self._keys

    def add(self, key: str, accepted_at: float, segment: int = -1) -> None:
        """Remember ``key`` (re-adding moves it to the end with the new segment)."""
        if self.max_keys == 0:
            return
        if key in self._keys:
            del self._keys[key]
        self._keys[key] = (accepted_at, segment)
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

    def in_segments(self, segments: set[int]) -> list[tuple[str, float]]:
        """Live keys currently carried by one of ``segments`` (for compaction)."""
        self.expire()
        return [(k, ts) for k, (ts, seg) in self._keys.items() if seg in segments]

    def relocate(self, keys: list[tuple[str, float]], segment: int) -> None:
        for key, ts in keys:
            if key in self._keys:
                self._keys[key] = (ts, segment)

    def items(self) -> Iterator[tuple[str, float, int]]:
        self.expire()
        for k, (ts, seg) in self._keys.items():
            yield k, ts, seg
