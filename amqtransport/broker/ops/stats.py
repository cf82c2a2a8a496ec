"""Small, thread-safe measurement primitives for the broker's metrics.

A :class:`Histogram` counts observations into fixed cumulative buckets, as Prometheus
histograms do (``le`` = "less than or equal"), plus their count and sum. The journal's
writer thread observes into them (fsync latency, group-commit batch size) and the
event loop reads a consistent :class:`HistogramSnapshot` for ``/metrics``; a lock
makes the pair safe, and costs one uncontended acquire per journal batch.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Histogram", "HistogramSnapshot", "LATENCY_BUCKETS", "SIZE_BUCKETS"]

#: seconds: 50 us .. 10 s (an fsync on tmpfs is ~ 10 us, on a loaded disk ~ 10 ms .. 1 s)
LATENCY_BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
)
#: records per group commit: powers of two up to 8192
SIZE_BUCKETS: tuple[float, ...] = tuple(float(1 << i) for i in range(14))


@dataclass(frozen=True)
class HistogramSnapshot:
    """``buckets``: (upper bound, cumulative count) pairs, ascending; ``+Inf`` is ``count``."""

    buckets: tuple[tuple[float, int], ...]
    count: int
    sum: float

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding quantile ``q`` (None when empty or past
        the last bound): a coarse figure for a console, not for alerting."""
        if self.count == 0:
            return None
        rank = q * self.count
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                return bound
        return None


class Histogram:
    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(bounds) or len(set(bounds)) != len(bounds):
            raise ValueError("histogram bounds must be strictly ascending")
        self.bounds = tuple(float(b) for b in bounds)
        self._counts = [0] * len(self.bounds)  # per bucket (not cumulative); the rest is +Inf
        self._count = 0
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        with self._lock:
            if i < len(self._counts):
                self._counts[i] += 1
            self._count += 1
            self._sum += value

    def snapshot(self) -> HistogramSnapshot:
        with self._lock:
            counts = list(self._counts)
            count, total = self._count, self._sum
        cumulative: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip(self.bounds, counts, strict=True):
            running += n
            cumulative.append((bound, running))
        return HistogramSnapshot(tuple(cumulative), count, total)
