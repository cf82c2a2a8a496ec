"""Batch and streaming writers of the ``amq`` data source.

Theory of operation
-------------------
``AmqDataSource.writer()`` / ``streamWriter()`` run on the driver (in a Python worker
the JVM starts); they validate the options and the schema, make the run id (batch),
and are pickled to every task and every retry. Each task:

1. takes the per-Python-worker cached connection for ``(uri, login)`` (one failover
   connection per worker process, reused by later tasks of that worker), or opens a
   fresh one when the task is a retry (``attemptNumber > 0``) or the previous task on
   this worker failed;
2. sends every row through ``Connection.producer(window=receiptWindow)``: up to
   ``receiptWindow`` sends in flight, each carrying a deterministic idempotency key
   (:mod:`amqtransport.spark.ids`);
3. waits for every receipt (``flush()``) and only then returns its commit message.
   A task that returns has every row receipted by the broker, i.e. durable (our
   broker fsyncs before it receipts a persistent send).

A failed attempt's messages stay sent; the retry re-sends the whole partition with the
same keys and the broker drops the copies, so the queue holds each row once. Failover
in the middle of a task is handled inside the client (the producer re-sends
unreceipted messages with their original keys after reconnecting).

Everything a task needs travels in the pickled writer (options, column positions,
run id), never in globals or environment variables of the driver process.

Tracing (``otelEndpoint``): each task is a span, ``spark write {destination}`` (kind
PRODUCER, ``messaging.batch.message_count`` the rows it sent, the partition and
attempt), in the trace of the ``traceparent`` option (the driver's context) or in a new
trace per task; every row's SEND carries the task span as its ``traceparent``, so the
broker's spans (``--otel-endpoint``) and the consumers' hang under the task. The span
is exported by the broker's exporter (``amqtransport/broker/tracing.py``: bounded
queue, never waits), one per worker process and endpoint; no OpenTelemetry package is
needed on the executors.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from amqtransport.errors import AmqTransportError
from amqtransport.spark.ids import batch_key, column_key, new_run_id, stream_key
from amqtransport.spark.options import AmqSparkOptionError, WriterOptions, normalize_destination

__all__ = [
    "AmqCommitMessage",
    "AmqDataError",
    "AmqBatchWriter",
    "AmqStreamWriter",
    "Columns",
    "resolve_columns",
    "drop_cached_connections",
]

log = logging.getLogger(__name__)

_TRACERS: dict[str, Any] = {}  # otelEndpoint -> SendTracer, one per worker process
_TRACERS_LOCK = threading.Lock()


def _task_tracer(endpoint: str) -> Any:
    from amqtransport.broker.tracing import SendTracer

    with _TRACERS_LOCK:
        tracer = _TRACERS.get(endpoint)
        if tracer is None:
            tracer = _TRACERS[endpoint] = SendTracer(endpoint, name=f"spark worker {os.getpid()}",
                                                     service="amq-spark-writer")
        return tracer


class _TaskSpan:
    """The span of one partition task (module docstring, "Tracing")."""

    def __init__(self, options: WriterOptions, partition: int, attempt: int) -> None:
        from amqtransport.broker.otlp import parse_traceparent

        parent = parse_traceparent(options.traceparent) if options.traceparent else None
        self.trace_id = parent.trace_id if parent is not None else os.urandom(16)
        self.parent_id = parent.span_id if parent is not None else b""
        self.span_id = os.urandom(8)
        self.header = f"00-{self.trace_id.hex()}-{self.span_id.hex()}-01"
        self.options = options
        self.partition = partition
        self.attempt = attempt
        self.start_ns = time.time_ns()

    def end(self, rows: int, error: BaseException | None) -> None:
        from amqtransport.broker.otlp import ServerSpan

        dest = self.options.destination or "(destination column)"
        attrs: dict[str, str | int | bool] = {
            "messaging.system": "amqtransport", "messaging.destination.name": dest,
            "messaging.operation.name": "send", "messaging.operation.type": "send",
            "messaging.batch.message_count": rows, "spark.partition": self.partition,
            "spark.attempt": self.attempt}
        if error is not None:
            attrs["error.type"] = type(error).__qualname__
        assert self.options.otel_endpoint is not None
        _task_tracer(self.options.otel_endpoint).export([ServerSpan(
            self.trace_id, self.span_id, self.parent_id, f"spark write {dest}", 4, self.start_ns, time.time_ns(),
            attrs, None if error is None else str(error))])

ALLOWED_COLUMNS = ("body", "destination", "headers", "id")


class AmqDataError(AmqTransportError, ValueError):
    """A row cannot be sent (null body, bad header, no destination); names the partition and row."""


@dataclass
class AmqCommitMessage(WriterCommitMessage):
    """What one successful task reports to ``commit``: every row counted here was receipted."""

    partition: int
    attempt: int
    rows: int
    seconds: float
    destinations: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Columns:
    """Positions of the recognised columns in the input rows (None when absent)."""

    body: int
    body_is_binary: bool
    destination: int | None
    headers: int | None
    id: int | None


def resolve_columns(schema: StructType, options: WriterOptions) -> Columns:
    """Check the input schema on the driver; a clear error naming the column otherwise."""
    names = [f.name for f in schema.fields]
    lowered = {n.lower(): i for i, n in enumerate(names)}
    if "body" not in lowered:
        raise AmqSparkOptionError(
            f"amq writer: the input needs a column named body (string or binary); it has {names}"
        )
    extra = [n for n in names if n.lower() not in ALLOWED_COLUMNS]
    if extra:
        raise AmqSparkOptionError(
            f"amq writer: unexpected column(s) {', '.join(repr(n) for n in extra)}; the input may have "
            f"only body (string or binary, required), destination (string), headers "
            f"(map<string,string>) and id (a business key); select or drop the others"
        )
    body_i = lowered["body"]
    body_type = schema.fields[body_i].dataType
    if not isinstance(body_type, StringType | BinaryType):
        raise AmqSparkOptionError(
            f"amq writer: column body must be string or binary, got {body_type.simpleString()}; "
            f"cast it, e.g. col('body').cast('string') or to_json(...)"
        )
    dest_i = lowered.get("destination")
    if dest_i is not None and not isinstance(schema.fields[dest_i].dataType, StringType):
        raise AmqSparkOptionError(
            f"amq writer: column destination must be a string, got "
            f"{schema.fields[dest_i].dataType.simpleString()}"
        )
    if dest_i is None and options.destination is None:
        raise AmqSparkOptionError(
            "amq writer: no destination: give .option(\"destination\", \"/queue/name\"), "
            ".save(\"/queue/name\") or a destination column"
        )
    headers_i = lowered.get("headers")
    if headers_i is not None:
        ht = schema.fields[headers_i].dataType
        if not (
            isinstance(ht, MapType) and isinstance(ht.keyType, StringType) and isinstance(ht.valueType, StringType)
        ):
            raise AmqSparkOptionError(
                f"amq writer: column headers must be map<string,string>, got {ht.simpleString()}"
            )
    id_i = lowered.get("id")
    if id_i is not None:
        it = schema.fields[id_i].dataType
        if isinstance(it, MapType | StructType) or it.typeName() == "array":
            raise AmqSparkOptionError(
                f"amq writer: column id must be an atomic value (string, number, binary), got {it.simpleString()}"
            )
    return Columns(
        body=body_i,
        body_is_binary=isinstance(body_type, BinaryType),
        destination=None if options.destination is not None else dest_i,
        headers=headers_i,
        id=id_i,
    )


# ----------------------------------------------------------------------------------------
# One failover connection per Python worker process, keyed by (uri, login).

_CACHE: dict[tuple[str, str | None], Any] = {}
_CACHE_LOCK = threading.Lock()


def _open(options: WriterOptions) -> Any:
    from amqtransport.client import connect

    return connect(options.uri, login=options.login, passcode=options.passcode)


def _connection(options: WriterOptions, *, fresh: bool) -> Any:
    key = (options.uri, options.login)
    with _CACHE_LOCK:
        conn = _CACHE.get(key)
        if conn is not None and fresh:
            _CACHE.pop(key, None)
            _close_quietly(conn)
            conn = None
        if conn is None:
            conn = _open(options)
            _CACHE[key] = conn
        return conn


def _drop(options: WriterOptions) -> None:
    with _CACHE_LOCK:
        conn = _CACHE.pop((options.uri, options.login), None)
    if conn is not None:
        _close_quietly(conn)


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - closing a broken connection must not mask the real error
        log.debug("closing a cached amq connection failed", exc_info=True)


def drop_cached_connections() -> None:
    """Close every cached connection of this process (tests and clean shutdown)."""
    with _CACHE_LOCK:
        conns = list(_CACHE.values())
        _CACHE.clear()
    for conn in conns:
        _close_quietly(conn)


# ----------------------------------------------------------------------------------------


def _task_context() -> tuple[int, int, Any]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # called outside a Spark task (unit use): partition 0, first attempt
        return 0, 0, None
    return ctx.partitionId(), ctx.attemptNumber(), ctx


def _send_partition(
    options: WriterOptions,
    cols: Columns,
    rows: Iterator[Any],
    key_of_row: Any,
    partition: int,
    attempt: int,
) -> AmqCommitMessage:
    started = time.monotonic()
    conn = _connection(options, fresh=attempt > 0)
    sent = 0
    per_dest: dict[str, int] = {}
    dest_cache: dict[str, str] = {}
    fail_after = options.fail_first_attempt_after if attempt == 0 else None
    task = _TaskSpan(options, partition, attempt) if options.otel_endpoint else None
    try:
        producer = conn.producer(window=options.receipt_window)
        with producer:
            for row_no, row in enumerate(rows):
                if fail_after is not None and sent >= fail_after:
                    producer.flush()
                    raise RuntimeError(
                        f"amq test hook test.failFirstAttemptAfter: failing attempt 0 of partition "
                        f"{partition} after {sent} receipted rows"
                    )
                body = row[cols.body]
                if body is None:
                    raise AmqDataError(f"amq writer: body is null in partition {partition}, row {row_no}")
                if cols.body_is_binary:
                    body = bytes(body)
                dest: str | None
                if cols.destination is None:
                    dest = options.destination
                else:
                    raw = row[cols.destination]
                    dest = dest_cache.get(raw)
                    if dest is None:
                        if not raw or not raw.strip():
                            raise AmqDataError(
                                f"amq writer: destination column is null/empty in partition {partition}, row {row_no}"
                            )
                        try:
                            dest = dest_cache[raw] = normalize_destination(raw)
                        except AmqSparkOptionError as exc:
                            raise AmqDataError(f"{exc} (partition {partition}, row {row_no})") from None
                headers = None
                if cols.headers is not None:
                    hm = row[cols.headers]
                    if hm:
                        headers = {str(k): "" if v is None else str(v) for k, v in hm.items()}
                if cols.id is not None:
                    try:
                        key = column_key(row[cols.id], options.id_prefix)
                    except ValueError as exc:
                        raise AmqDataError(f"{exc} (partition {partition}, row {row_no})") from None
                else:
                    key = key_of_row(row_no)
                if options.duplicate_id_header:  # e.g. _AMQ_DUPL_ID for Artemis' duplicate detection
                    headers = {**(headers or {}), options.duplicate_id_header: key}
                if task is not None:
                    headers = {**(headers or {}), "traceparent": task.header}
                assert dest is not None  # resolve_columns guarantees an option or a column
                producer.send(dest, body, headers=headers, persistent=options.persistent, idempotency_key=key)
                sent += 1
                per_dest[dest] = per_dest.get(dest, 0) + 1
            producer.flush()
    except BaseException as exc:
        _drop(options)  # never reuse a connection of a failed task
        if task is not None:
            task.end(sent, exc)
        raise
    if task is not None:
        task.end(sent, None)
    seconds = time.monotonic() - started
    log.info("amq: partition %d attempt %d sent %d rows in %.3fs", partition, attempt, sent, seconds)
    return AmqCommitMessage(partition=partition, attempt=attempt, rows=sent, seconds=seconds, destinations=per_dest)


def _summary(messages: list[WriterCommitMessage | None]) -> dict[str, Any]:
    done = [m for m in messages if isinstance(m, AmqCommitMessage)]
    dests: dict[str, int] = {}
    for m in done:
        for d, n in m.destinations.items():
            dests[d] = dests.get(d, 0) + n
    return {
        "rows": sum(m.rows for m in done),
        "partitions": len(done),
        "failed_partitions": len(messages) - len(done),
        "retried_partitions": sum(1 for m in done if m.attempt > 0),
        "max_task_seconds": max((m.seconds for m in done), default=0.0),
        "destinations": dests,
    }


def _write_report(path: str, record: dict[str, Any], *, append: bool) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    if append:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        return
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(record, fh)
    os.replace(tmp, path)


class AmqBatchWriter(DataSourceWriter):
    """``df.write.format("amq")...mode("append").save()``."""

    def __init__(self, options: WriterOptions, schema: StructType) -> None:
        self.options = options
        self.columns = resolve_columns(schema, options)
        # Made once, on the driver: every task and every retry of this job shares it.
        self.run_id = options.id_prefix or new_run_id()

    def write(self, iterator: Iterator[Any]) -> AmqCommitMessage:
        partition, attempt, _ = _task_context()
        run_id = self.run_id
        return _send_partition(
            self.options,
            self.columns,
            iterator,
            lambda row_no: batch_key(run_id, partition, row_no),
            partition,
            attempt,
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        summary = _summary(messages) | {"run_id": self.run_id, "status": "committed"}
        log.info("amq: write job %s committed: %s", self.run_id, summary)
        if self.options.report_path:
            _write_report(self.options.report_path, summary, append=False)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        summary = _summary(messages) | {"run_id": self.run_id, "status": "aborted"}
        log.warning(
            "amq: write job %s aborted; %d partition(s) finished and their rows stay sent "
            "(re-running with the same idPrefix re-sends with the same keys, deduplicated by the broker)",
            self.run_id,
            summary["partitions"],
        )
        if self.options.report_path:
            _write_report(self.options.report_path, summary, append=False)


class AmqStreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("amq")...start()``: keys from query id, batch id, partition and row."""

    def __init__(self, options: WriterOptions, schema: StructType) -> None:
        self.options = options
        self.columns = resolve_columns(schema, options)

    def write(self, iterator: Iterator[Any]) -> AmqCommitMessage:
        partition, attempt, ctx = _task_context()
        query_id = batch_id = None
        if ctx is not None:
            query_id = ctx.getLocalProperty("sql.streaming.queryId")
            batch_id = ctx.getLocalProperty("streaming.sql.batchId")
        if not query_id or batch_id is None:
            raise AmqDataError(
                "amq stream writer: Spark did not pass the streaming query id / batch id to the task "
                "(local properties sql.streaming.queryId, streaming.sql.batchId); cannot make replay-safe keys"
            )
        prefix = f"{self.options.id_prefix}-{query_id}" if self.options.id_prefix else query_id
        return _send_partition(
            self.options,
            self.columns,
            iterator,
            lambda row_no: stream_key(prefix, batch_id, partition, row_no),
            partition,
            attempt,
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        summary = _summary(messages) | {"batch_id": batchId, "status": "committed"}
        log.info("amq: micro-batch %d committed: %s", batchId, summary)
        if self.options.report_path:
            _write_report(self.options.report_path, summary, append=True)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        summary = _summary(messages) | {"batch_id": batchId, "status": "aborted"}
        log.warning("amq: micro-batch %d aborted: %s", batchId, summary)
        if self.options.report_path:
            _write_report(self.options.report_path, summary, append=True)
