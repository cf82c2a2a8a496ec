"""A PySpark batch job writing rows to a queue through a failover URI, on any master.

    # local (starts an embedded broker when --uri is not given)
    .venv/bin/python examples/spark_producer.py
    # a standalone cluster, YARN, ...: spark-submit decides the master
    spark-submit --master spark://host:7077 examples/spark_producer.py \\
        --uri "failover:(tcp://mq1:61613,tcp://mq2:61613)?randomize=false" --rows 1000000
    # Spark Connect (the server's Python needs amqtransport)
    python examples/spark_producer.py --remote sc://host:15002 --uri "failover:(...)"

Each Spark task opens its own failover connection, sends its partition with a receipt
window and deterministic idempotency keys (``<idPrefix>-p<partition>-r<row>``), and
returns only when every row is receipted. Re-running the job with the same
``--id-prefix`` re-sends the same keys: a deduplicating broker (ours, Artemis) keeps
one copy. ``amq demo`` is the same job with a master killed in the middle.

The session comes from :func:`amqtransport.spark.session.job_session`: ``--master`` or
``--remote`` when given, else spark-submit's, else ``local[2,3]``. Nothing here sets
``PYSPARK_PYTHON``: on a cluster, spark-submit's environment decides the executors' Python.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Iterator


@contextlib.contextmanager
def broker_or(uri: str | None) -> Iterator[str]:
    if uri:
        yield uri
        return
    from amqtransport.broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        print(f"started an embedded broker at {broker.uri}")
        yield f"failover:({broker.uri})?randomize=false"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", help="connection URI (default: start an embedded broker)")
    ap.add_argument("--destination", default="/queue/examples.spark.orders")
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=4, help="one connection per partition")
    ap.add_argument("--id-prefix", default=None, help="stable prefix: re-runs are deduplicated by the broker")
    ap.add_argument("--window", type=int, default=200, help="receipt window (sends in flight per task)")
    ap.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[2,3])")
    ap.add_argument("--remote", default=None, help="Spark Connect URL, e.g. sc://127.0.0.1:15002")
    ap.add_argument("--report", default=None,
                    help="reportPath: the driver writes the job's JSON summary there (on a Connect server: its disk)")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = ap.parse_args()

    from amqtransport.spark.session import job_session

    with broker_or(args.uri) as uri:
        spark = job_session("amq-spark-producer", master=args.master, remote=args.remote)
        try:
            df = spark.range(0, args.rows, 1, args.partitions).selectExpr(
                "to_json(named_struct('order', id, 'amount', id % 100)) AS body",
                "map('source', 'spark', 'kind', 'order') AS headers",
            )
            w = (
                df.write.format("amq")
                .mode("append")
                .option("uri", uri)
                .option("destination", args.destination)
                .option("receiptWindow", str(args.window))
            )
            if args.id_prefix:
                w = w.option("idPrefix", args.id_prefix)
            if args.report:
                w = w.option("reportPath", args.report)
            # warm-up: the first Python data-source write of a session starts Spark's Python workers
            spark.range(1).selectExpr("'warm-up' AS body").write.format("amq").mode("append").option(
                "uri", uri
            ).option("destination", args.destination + ".warmup").save()
            started = time.perf_counter()
            w.save()
            took = time.perf_counter() - started
            if args.json:
                print(json.dumps({"rows": args.rows, "seconds": round(took, 3), "rows_per_s": round(args.rows / took),
                                  "destination": args.destination}))
            else:
                print(f"wrote {args.rows:,} rows to {args.destination} in {took:.2f}s "
                      f"({args.rows / took:,.0f} rows/s), all receipted")
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
