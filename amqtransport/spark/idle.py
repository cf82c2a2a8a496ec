"""Running a streaming query that reads a queue until its input is drained.

A queue has no end, so for the ``amq`` stream reader "no new data" means that one
``latestOffset`` poll found no message within ``receiveTimeout``, and Spark's
``query.processAllAvailable()`` returns after the first trigger like that. A broker that
is failing over, restarting, or slowed by a loaded machine looks the same: the rest of
the input is still on the queue (unacked, nothing lost) and later triggers read it, but a
job that stopped at that point would stop early. :func:`run_until_idle` is what "drain the
input" means instead: run until no micro-batch has brought a row for ``idle`` seconds
(the examples' ``--until-idle``). The clock is injected so the rule is unit-tested.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["run_until_idle"]


def run_until_idle(query: Any, idle: float = 3.0, *, clock: Callable[[], float] = time.monotonic) -> int:
    """Call ``query.processAllAvailable()`` (a ``StreamingQuery``) until its micro-batches
    have read no row for ``idle`` seconds; return the rows its progress reports count
    (``recentProgress``: the last 100 batches, read after every round). A query that
    failed raises its error from ``processAllAvailable``."""
    if idle < 0:
        raise ValueError(f"idle must be >= 0 seconds, got {idle}")
    rows: dict[int, int] = {}
    total = -1  # the first round starts the clock
    changed = clock()
    while True:
        query.processAllAvailable()
        for p in query.recentProgress:
            batch = int(p["batchId"])
            rows[batch] = max(rows.get(batch, 0), int(p["numInputRows"]))
        now, seen = clock(), sum(rows.values())
        if seen != total:
            total, changed = seen, now
        elif now - changed >= idle:
            return total
