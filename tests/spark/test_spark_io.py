"""The ``amq`` data source against a real broker process: exactly N rows land.

Counting consumers use ``dedupe=False`` so that the client's own duplicate filter
cannot hide a duplicate that is really in the queue.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import await_sink_rows, drain, failover, queue

import amqtransport

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One embedded broker (a thread of this test process) for the tests that do not kill it."""
    from amqtransport.broker import EmbeddedBroker

    with EmbeddedBroker(data_dir=tmp_path_factory.mktemp("spark-broker")) as b:
        yield b


def rows_df(spark: Any, n: int, parts: int) -> Any:
    return spark.range(0, n, 1, parts).selectExpr(
        "concat('row-', cast(id as string)) AS body", "map('n', cast(id as string)) AS headers"
    )


def test_batch_write_lands_exactly_n(spark: Any, broker: Any, tmp_path: Path) -> None:
    dest, n = queue(), 3000
    report = tmp_path / "report.json"
    (rows_df(spark, n, 3).write.format("amq").mode("append").option("uri", failover(broker))
     .option("destination", dest).option("receiptWindow", "50").option("reportPath", str(report)).save())
    summary = json.loads(report.read_text())
    assert summary["rows"] == n and summary["partitions"] == 3 and summary["status"] == "committed"
    got = drain(failover(broker), dest)
    assert len(got) == n
    assert sorted(m.text for m in got) == sorted(f"row-{i}" for i in range(n))
    assert all(m.headers["n"] == m.text[4:] for m in got)
    keys = {m.idempotency_key for m in got}
    assert len(keys) == n and all(k.startswith(summary["run_id"] + "-p") for k in keys)


def test_forced_task_retry_still_lands_exactly_n(spark: Any, broker: Any, tmp_path: Path) -> None:
    """Attempt 0 of every task sends (and gets receipts for) half its partition, then fails."""
    dest, n, parts = queue(), 2000, 2
    report = tmp_path / "report.json"
    (rows_df(spark, n, parts).write.format("amq").mode("append").option("uri", failover(broker))
     .option("destination", dest).option("reportPath", str(report))
     .option("test.failFirstAttemptAfter", str(n // parts // 2)).save())
    summary = json.loads(report.read_text())
    assert summary["retried_partitions"] == parts  # every task really was retried
    got = drain(failover(broker), dest)
    assert len(got) == n and len({m.text for m in got}) == n


def test_id_column_makes_a_rerun_a_no_op(spark: Any, broker: Any) -> None:
    dest, n = queue(), 500
    df = spark.range(0, n, 1, 2).selectExpr("concat('order-', cast(id as string)) AS id", "'payload' AS body")
    for _ in range(2):  # the same job twice: the second run's keys are all repeats
        df.write.format("amq").mode("append").option("uri", failover(broker)).option("destination", dest).save()
    got = drain(failover(broker), dest)
    assert len(got) == n and {m.idempotency_key for m in got} == {f"order-{i}" for i in range(n)}


def test_destination_column_and_binary_body(spark: Any, broker: Any) -> None:
    """Also: duplicateIdHeader copies each key into a second header (Artemis' _AMQ_DUPL_ID)."""
    qa, qb = queue(), queue()
    df = spark.createDataFrame(
        [(bytes([0, 1, 2, i]), qa if i % 2 else qb[len("/queue/"):]) for i in range(10)],  # "x" means /queue/x
        "body binary, destination string",
    )
    df.write.format("amq").mode("append").option("uri", failover(broker)).option(
        "duplicateIdHeader", "_AMQ_DUPL_ID"
    ).save()
    a, b = drain(failover(broker), qa, idle=1.0), drain(failover(broker), qb, idle=1.0)
    assert sorted(m.body for m in a) == [bytes([0, 1, 2, i]) for i in range(1, 10, 2)]
    assert len(b) == 5
    assert all(m.headers["_AMQ_DUPL_ID"] == m.headers["amq-idempotency-key"] for m in a + b)


def test_streaming_across_broker_kill_lands_every_row_once(spark: Any, tmp_path: Path) -> None:
    """A file stream into ``amq``; the broker is SIGKILLed and restarted mid-stream, and the
    first attempt of every task fails halfway (a retry inside each micro-batch)."""
    from amqtransport.testing.broker_process import BrokerProcess

    src = tmp_path / "in"
    src.mkdir()
    files, per_file = 4, 400

    def add_file(i: int) -> None:
        tmp = tmp_path / f"f{i}.tmp"
        tmp.write_text("".join(json.dumps({"body": f"s{i}-{j}"}) + "\n" for j in range(per_file)))
        tmp.rename(src / f"f{i}.json")

    for i in range(2):
        add_file(i)
    dest = queue()
    with BrokerProcess(tmp_path / "broker", port=0) as proc:
        uri = failover(proc)
        query = (
            spark.readStream.schema("body string").option("maxFilesPerTrigger", 1).json(str(src))
            .repartition(2)
            .writeStream.format("amq").option("uri", uri).option("destination", dest)
            .option("test.failFirstAttemptAfter", str(per_file // 4))
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(processingTime="200 milliseconds").start()
        )
        try:
            deadline = time.monotonic() + 60
            while (query.lastProgress is None or query.lastProgress["batchId"] < 0) and time.monotonic() < deadline:
                assert query.exception() is None
                time.sleep(0.1)
            proc.kill()  # mid-stream: later batches find the broker gone
            restart = threading.Timer(1.0, proc.restart)
            restart.start()
            for i in range(2, files):
                add_file(i)
            restart.join()
            query.processAllAvailable()
        finally:
            query.stop()
        got = drain(uri, dest)
    bodies = [m.text for m in got]
    assert len(bodies) == files * per_file
    assert set(bodies) == {f"s{i}-{j}" for i in range(files) for j in range(per_file)}


def test_stream_reader_round_trip_acks_after_commit(spark: Any, broker: Any, tmp_path: Path) -> None:
    src, n = queue(), 300
    uri = failover(broker)
    with amqtransport.connect(uri) as conn, conn.producer(window=100) as p:
        for i in range(n):
            p.send(src, f"m-{i}", headers={"i": str(i)})

    out = tmp_path / "out"

    def run(expect: int) -> list[Any]:
        q = (
            spark.readStream.format("amq").option("uri", uri).option("destination", src)
            .option("walPath", str(tmp_path / "ckpt" / "amq-wal")).option("maxBatchSize", "120").load()
            .selectExpr("cast(body AS string) AS body", "headers", "seq")
            .writeStream.format("parquet").option("path", str(out))
            .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="200 milliseconds").start()
        )
        try:
            await_sink_rows(spark, q, out, expect)
        finally:
            q.stop()
        return [r.asDict() for r in spark.read.parquet(str(out)).collect()]

    first = run(n)
    assert sorted(r["body"] for r in first) == sorted(f"m-{i}" for i in range(n))
    assert {r["headers"]["i"] for r in first} == {str(i) for i in range(n)}
    assert sorted(r["seq"] for r in first) == list(range(1, n + 1))
    # everything was acked after its batch committed: the queue is empty ...
    assert drain(uri, src, idle=1.0) == []
    # ... and the restarted query (same checkpoint) sees only what is new
    with amqtransport.connect(uri) as conn:
        conn.send(src, "late")
    second = run(n + 1)
    assert len(second) == n + 1
    assert [r["body"] for r in second if r["seq"] > n] == ["late"]


def test_stream_reader_across_broker_kill_loses_nothing(spark: Any, tmp_path: Path) -> None:
    """The driver-side subscription fails over (broker SIGKILLed and restarted between
    micro-batches): every message reaches the sink, none twice, and all end up acked.

    The restarted broker is then frozen (SIGSTOP) for 2 s, as a loaded machine slows it:
    the triggers meanwhile find nothing. A single ``processAllAvailable()`` returned on the
    first such trigger with 120 of the 240 rows in the sink (once in a loaded suite run,
    every time with the freeze); the other 120 were still on the queue, unacked. So the
    test runs the query until the sink holds them all (``await_sink_rows``)."""
    from amqtransport.testing.broker_process import BrokerProcess

    src, n = queue(), 240
    with BrokerProcess(tmp_path / "broker", port=0) as proc:
        uri = failover(proc)
        with amqtransport.connect(uri) as conn, conn.producer(window=100) as p:
            for i in range(n):
                p.send(src, f"k-{i}")
        out = tmp_path / "out"
        q = (
            spark.readStream.format("amq").option("uri", uri).option("destination", src)
            .option("walPath", str(tmp_path / "ckpt" / "amq-wal")).option("maxBatchSize", "60")
            .option("prefetch", "60").load()
            .selectExpr("cast(body AS string) AS body", "seq")
            .writeStream.format("parquet").option("path", str(out))
            .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="300 milliseconds").start()
        )
        try:
            deadline = time.monotonic() + 60
            while (q.lastProgress is None or q.lastProgress["batchId"] < 0) and time.monotonic() < deadline:
                assert q.exception() is None
                time.sleep(0.1)
            proc.kill()
            time.sleep(0.5)
            proc.restart()
            os.kill(proc.pid, signal.SIGSTOP)
            thaw = threading.Timer(2.0, os.kill, (proc.pid, signal.SIGCONT))
            thaw.start()
            try:
                await_sink_rows(spark, q, out, n)
            finally:
                thaw.cancel()
                os.kill(proc.pid, signal.SIGCONT)  # (again, harmless) whatever happened
        finally:
            q.stop()
        rows = [r.asDict() for r in spark.read.parquet(str(out)).collect()]
        assert sorted(r["body"] for r in rows) == sorted(f"k-{i}" for i in range(n))
        assert len({r["seq"] for r in rows}) == n
        assert drain(uri, src, idle=1.0) == []


def test_bad_rows_fail_the_job_with_a_clear_error(spark: Any, broker: Any) -> None:
    dest = queue()
    df = spark.createDataFrame([("ok",), (None,)], "body string").coalesce(1)
    with pytest.raises(Exception, match=r"body is null in partition 0, row 1"):
        df.write.format("amq").mode("append").option("uri", failover(broker)).option("destination", dest).save()
    bad_dest = spark.createDataFrame([("x", " ")], "body string, destination string").coalesce(1)
    with pytest.raises(Exception, match=r"destination column is null/empty in partition 0, row 0"):
        bad_dest.write.format("amq").mode("append").option("uri", failover(broker)).save()
