"""Small, thread-safe measurement primitives for the broker's metrics.

A :class:`Histogram` counts observations into fixed cumulative buckets, as Prometheus
histograms do (``le`` = "less than or equal"), plus their count and sum. The journal's
writer thread observes into them (fsync latency, group-commit batch size) and the
event loop reads a consistent :class:`HistogramSnapshot` for ``/metrics``; a lock
makes the pair safe, and costs one uncontended acquire per journal batch.

:data:`RECEIPT_PATH` (a :class:`ReceiptPath`) holds one histogram per stage of a
receipted frame's way through this process -- read and parsed, queued for the journal,
written and fdatasynced, streamed to a slave and acknowledged, handed back to the event
loop, its RECEIPT handed to the socket -- so ``/metrics`` (``amq_receipt_<stage>_seconds``)
and ``benchmarks/bench_latency.py`` can say where the time of a receipt goes. It is
process-wide like the process it measures: each stage is observed where it happens
(the journal writer, the replication link, the connection), without a handle passed down.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Histogram",
    "HistogramSnapshot",
    "LATENCY_BUCKETS",
    "RECEIPT_PATH",
    "RECEIPT_STAGES",
    "ReceiptPath",
    "SIZE_BUCKETS",
    "STAGE_BUCKETS",
]

#: seconds: 50 us .. 10 s (an fsync on tmpfs is ~ 10 us, on a loaded disk ~ 10 ms .. 1 s)
LATENCY_BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
)
#: seconds: 10 us .. 10 s, for the stages of a receipt (a thread hand-off takes ~ 10 .. 100 us)
STAGE_BUCKETS: tuple[float, ...] = (0.00001, 0.000025, *LATENCY_BUCKETS)
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


#: (stage, help) of :class:`ReceiptPath`, in path order; ``/metrics`` names each
#: ``amq_receipt_<stage>_seconds``
RECEIPT_STAGES: tuple[tuple[str, str], ...] = (
    ("read", "Handling one client read: parsing its frames, routing them, queueing their journal records "
             "(a slave: one replication read, its records decoded and queued; applied after its ACK)."),
    ("journal_wakeup", "An append waking the idle journal writer (condition variable) -> the writer running."),
    ("journal_queue", "A group commit's first record queued -> the journal writer taking the batch."),
    ("journal_sync", "Writing and fdatasyncing one group commit (and checking its file still has a name)."),
    ("replication_send", "A record appended on the master -> its RECORDS frame written to the slave's socket "
                         "(0 for the first of a loop turn: it goes at once)."),
    ("slave_ack", "Records written to the slave's socket -> the slave's ACK that they are on its disk."),
    ("gate_wait", "A batch on the master's disk -> its completions released by the slave's ACK (replicated)."),
    ("handoff", "The journal writer handing a batch's completions to the event loop -> them running "
                "(0 for a batch the loop committed itself: Journal.commit_turn)."),
    ("receipt_write", "A batch's completions starting -> their RECEIPT frames (a slave: its ACK) handed to the sockets."),
    ("total", "A receipted frame read and parsed -> its RECEIPT handed to the socket (the whole path; a slave: "
              "a replication read -> its ACK handed to the socket, when fsynced on its loop)."),
)


class ReceiptPath:
    """One :class:`Histogram` per stage of :data:`RECEIPT_STAGES` (seconds, :data:`STAGE_BUCKETS`)."""

    def __init__(self) -> None:
        self.read = Histogram(STAGE_BUCKETS)
        self.journal_wakeup = Histogram(STAGE_BUCKETS)
        self.journal_queue = Histogram(STAGE_BUCKETS)
        self.journal_sync = Histogram(STAGE_BUCKETS)
        self.replication_send = Histogram(STAGE_BUCKETS)
        self.slave_ack = Histogram(STAGE_BUCKETS)
        self.gate_wait = Histogram(STAGE_BUCKETS)
        self.handoff = Histogram(STAGE_BUCKETS)
        self.receipt_write = Histogram(STAGE_BUCKETS)
        self.total = Histogram(STAGE_BUCKETS)

    def snapshot(self) -> tuple[tuple[str, str, HistogramSnapshot], ...]:
        """``(stage, help, snapshot)`` per stage, in path order."""
        return tuple((name, text, getattr(self, name).snapshot()) for name, text in RECEIPT_STAGES)


#: the stages of this process's receipts (see the module docstring)
RECEIPT_PATH = ReceiptPath()
