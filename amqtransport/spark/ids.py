"""Deterministic idempotency keys for rows written by the ``amq`` data source.

Why: Spark retries a failed task by re-running the whole partition, and a streaming
query replays an uncommitted micro-batch after a restart. Every copy of a row must
carry the *same* ``amq-idempotency-key`` so the broker (ours drops repeats; Artemis
does the same with ``_AMQ_DUPL_ID``) keeps exactly one.

- batch:     ``<idPrefix or run id>-p<partition>-r<row>``; the run id is made once in
  ``writer()`` on the driver and pickled to every task and every retry of this job.
- streaming: ``<queryId>-b<batchId>-p<partition>-r<row>``; the query id lives in the
  checkpoint, the batch id is stable across replays of a micro-batch.
- an ``id`` column (a business key) wins: ``<id>`` (or ``<idPrefix>-<id>``), stable
  across jobs too.

The row number is the position inside the task's input partition, so positional keys
assume the partition's rows arrive in the same order on a retry (true for files,
tables and the rate source; after an unordered shuffle, give an ``id`` column).
Pure: no I/O.
"""

from __future__ import annotations

import uuid

__all__ = ["new_run_id", "batch_key", "stream_key", "column_key"]


def new_run_id() -> str:
    """A fresh run id (made once per write job, in ``writer()`` on the driver)."""
    return "spark-" + uuid.uuid4().hex[:16]


def batch_key(prefix: str, partition: int, row: int) -> str:
    return f"{prefix}-p{partition}-r{row}"


def stream_key(query_id: str, batch_id: int | str, partition: int, row: int) -> str:
    return f"{query_id}-b{batch_id}-p{partition}-r{row}"


def column_key(value: object, prefix: str | None = None) -> str:
    """Key from a business ``id`` column value; a clear error for null/empty/multi-line ids."""
    if value is None:
        raise ValueError("amq: the id column is null in a row; every row needs an id when the column is present")
    if isinstance(value, bytes | bytearray):
        text = bytes(value).decode("utf-8", "backslashreplace")
    else:
        text = str(value)
    if text == "":
        raise ValueError("amq: the id column is empty in a row")
    if any(c in text for c in "\r\n\0"):
        raise ValueError(f"amq: the id column must not contain CR, LF or NUL: {text!r}")
    return text if prefix is None else f"{prefix}-{text}"
