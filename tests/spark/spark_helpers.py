"""Helpers shared by the Spark tests: unique queues, failover URIs, counting consumers."""

from __future__ import annotations

import uuid
from typing import Any

import amqtransport

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
