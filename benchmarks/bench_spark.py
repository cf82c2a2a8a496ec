"""Rows/s written by the ``amq`` Spark data source vs a plain Python loop with our client.

Same broker process, same run, same rows (``body = "row-<i>"``, persistent, receipt
window 200). Ours: ``df.write.format("amq")`` from a DataFrame with 2 partitions on
``local[2]`` (2 tasks, 2 connections), timed around ``save()`` with the session warm.
Peer: one connection, ``Connection.producer(window=200)``, a ``for`` loop. Rounds
alternate (Spark, loop, Spark, loop, ...); the ratio of medians is reported
(higher is better for us; the target in issue 8 is >= 0.7).

Each round writes to its own queue, which is drained (untimed) right after, so the
broker's backlog does not grow across rounds.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import compare, print_table, quick, scale, work_dir, write_result  # noqa: E402

WINDOW = 200


def drain_count(uri: str, dest: str, expected: int) -> int:
    """How many of ``expected`` messages ``dest`` yields (5 s without one ends it); shared with bench_spark_cluster."""
    import amqtransport

    got = 0
    with amqtransport.connect(uri, dedupe=False) as conn:
        sub = conn.subscribe(dest, prefetch=1000)
        while got < expected and sub.receive(timeout=5.0) is not None:
            got += 1
    return got


def main() -> None:
    import amqtransport
    from amqtransport.spark.session import local_session
    from amqtransport.testing.broker_process import BrokerProcess

    rows = scale(50_000, 5_000)
    rounds = 1 if quick() else 3
    workdir = work_dir("amq-bench-spark-")
    with BrokerProcess(workdir / "broker", port=0) as broker:
        uri = f"failover:({broker.uri})?randomize=false"
        spark = local_session(master="local[2]", app="amq-bench-spark")
        try:
            counter = iter(range(1_000_000))

            def spark_round() -> float:
                dest = f"/queue/bench.spark.{next(counter)}"
                df = spark.range(0, rows, 1, 2).selectExpr("concat('row-', cast(id as string)) AS body")
                w = df.write.format("amq").mode("append").option("uri", uri).option("destination", dest)
                w = w.option("receiptWindow", str(WINDOW))
                t0 = time.perf_counter()
                w.save()
                took = time.perf_counter() - t0
                assert drain_count(uri, dest, rows) == rows
                return rows / took

            def loop_round() -> float:
                dest = f"/queue/bench.loop.{next(counter)}"
                t0 = time.perf_counter()
                with amqtransport.connect(uri) as conn, conn.producer(window=WINDOW) as producer:
                    for i in range(rows):
                        producer.send(dest, f"row-{i}", idempotency_key=f"loop-{dest}-{i}")
                took = time.perf_counter() - t0
                assert drain_count(uri, dest, rows) == rows
                return rows / took

            # warm-up: the first Python data-source write pays for worker start-up and imports
            spark.range(0, 100, 1, 2).selectExpr("cast(id as string) AS body").write.format("amq").mode(
                "append"
            ).option("uri", uri).option("destination", "/queue/bench.warmup").save()
            cmp = compare(spark_round, loop_round, rounds=rounds)
        finally:
            spark.stop()
    table = [
        {
            "rows": rows,
            "spark rows/s (2 partitions)": cmp.ours,
            "plain loop rows/s (1 conn)": cmp.peer,
            "ratio spark/loop (higher better)": cmp.ratio,
            "spark rounds": ", ".join(f"{x:,.0f}" for x in cmp.ours_all),
            "loop rounds": ", ".join(f"{x:,.0f}" for x in cmp.peer_all),
        }
    ]
    print_table(table, title="amq Spark data source vs a plain client loop (same broker, same run)")
    write_result(
        "spark",
        table,
        headline={"spark rows/s": round(cmp.ours), "spark/loop ratio": round(cmp.ratio, 2)},
        notes=f"persistent sends, receipt window {WINDOW}, broker = one embedded broker process; target ratio >= 0.7",
    )


if __name__ == "__main__":
    main()
