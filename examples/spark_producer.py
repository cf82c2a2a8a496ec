"""A PySpark batch job writing rows to a queue through a failover URI.

    .venv/bin/python examples/spark_producer.py                       # starts an embedded broker
    .venv/bin/python examples/spark_producer.py --uri "failover:(tcp://127.0.0.1:61613,tcp://127.0.0.1:61614)?randomize=false"

Each Spark task opens its own failover connection, sends its partition with a receipt
window and deterministic idempotency keys (``<idPrefix>-p<partition>-r<row>``), and
returns only when every row is receipted. Re-running the job with the same
``--id-prefix`` re-sends the same keys: a deduplicating broker (ours, Artemis) keeps
one copy. ``amq demo`` is the same job with a master killed in the middle.
"""

from __future__ import annotations

import argparse
import contextlib
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
    args = ap.parse_args()

    from amqtransport.spark.session import local_session

    with broker_or(args.uri) as uri:
        spark = local_session(app="amq-spark-producer")
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
                .option("receiptWindow", "200")
            )
            if args.id_prefix:
                w = w.option("idPrefix", args.id_prefix)
            # warm-up: the first Python data-source write of a session starts Spark's Python workers
            spark.range(1).selectExpr("'warm-up' AS body").write.format("amq").mode("append").option(
                "uri", uri
            ).option("destination", args.destination + ".warmup").save()
            started = time.perf_counter()
            w.save()
            took = time.perf_counter() - started
            print(f"wrote {args.rows:,} rows to {args.destination} in {took:.2f}s ({args.rows / took:,.0f} rows/s), all receipted")
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
