"""Helpers shared by the Spark tests: unique queues, failover URIs, counting consumers."""

from __future__ import annotations

import uuid
from typing import Any

import amqtransport
from amqtransport.testing.wait import wait_for

FAST_FAILOVER = "randomize=false&initialReconnectDelay=20&maxReconnectDelay=200"


def failover(*procs: Any) -> str:
    """``failover:(...)`` over the given brokers (anything with a ``uri``), reconnecting fast."""
    return f"failover:({','.join(p.uri for p in procs)})?{FAST_FAILOVER}"


def queue() -> str:
    return f"/queue/spark.{uuid.uuid4().hex[:10]}"


def drain(uri: str, dest: str, *, idle: float = 2.0, limit: int | None = None) -> list[Any]:
    """Every message on ``dest`` until ``idle`` seconds pass without one. ``dedupe=False``:
    the client's own duplicate filter must not hide a copy really stored twice."""
    out: list[Any] = []
    with amqtransport.connect(uri, dedupe=False) as conn:
        sub = conn.subscribe(dest, ack="auto", prefetch=500)
        while limit is None or len(out) < limit:
            msg = sub.receive(timeout=idle)
            if msg is None:
                break
            out.append(msg)
    return out


def await_sink_rows(spark: Any, query: Any, path: Any, n: int, *, timeout: float = 120.0) -> int:
    """Run the streaming ``query`` until its parquet sink at ``path`` holds ``n`` rows (or
    more: the caller's assertions catch duplicates); return the count.

    ``processAllAvailable()`` alone is not that: with a queue source it returns after the
    first trigger whose ``latestOffset`` found no message within ``receiveTimeout``. That is
    also what a broker still coming back after a restart, or a loaded machine, looks like:
    the rest is still on the queue (unacked) and later triggers read it. Each round here
    ends on such a trigger, so the last batch's offsets are committed (its messages acked)
    when this returns. A query that died raises its error from ``processAllAvailable``."""
    from pyspark.errors import AnalysisException

    seen = [0]

    def enough() -> bool:
        query.processAllAvailable()
        seen[0] = int(spark.read.parquet(str(path)).count())
        return seen[0] >= n

    try:
        wait_for(enough, timeout, f"{n} rows in the sink at {path}", interval=0.2, ignore=(AnalysisException,))
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the sink held {seen[0]} rows") from None
    return seen[0]
