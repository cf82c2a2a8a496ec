"""Structured Streaming in and out of queues with the ``amq`` data source.

    .venv/bin/python examples/spark_streaming.py --seconds 20      # starts an embedded broker
    spark-submit --master spark://host:7077 examples/spark_streaming.py --uri "failover:(...)" \
        --checkpoint /durable/chk/stream-example                   # on a cluster

1. A ``rate`` source writes ``--rate`` rows/s to ``/queue/examples.stream.in`` with
   ``writeStream.format("amq")``: keys ``<queryId>-b<batchId>-p<partition>-r<row>`` make a
   replayed micro-batch (after a crash, from the checkpoint) a no-op at the broker.
2. ``readStream.format("amq")`` reads that queue at-least-once (messages are logged to a
   write-ahead log under the checkpoint before a batch is planned and acked only after
   the batch commits) and writes them on to ``/queue/examples.stream.out`` keeping the
   original key in the ``id`` column, so the second hop is exactly-once at the queue too
   (the relay recipe of docs/spark.md; ``examples/spark_relay.py`` is the same relay alone).

The session comes from ``job_session``: ``--master``/``--remote`` when given, else
spark-submit's, else ``local[2,3]``; ``PYSPARK_PYTHON`` is left to the environment.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


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
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rate", type=int, default=200, help="rows per second from the rate source")
    ap.add_argument("--checkpoint", default=None, help="checkpoint root (default: a temp dir; on a cluster: durable)")
    ap.add_argument("--id-prefix", default=None, help="relay keys become <prefix>-<input key> (docs/spark.md)")
    ap.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[2,3])")
    ap.add_argument("--remote", default=None, help="Spark Connect URL, e.g. sc://127.0.0.1:15002")
    args = ap.parse_args()

    from amqtransport.spark.idle import run_until_idle
    from amqtransport.spark.session import job_session

    root = Path(args.checkpoint or tempfile.mkdtemp(prefix="amq-stream-"))
    with broker_or(args.uri) as uri:
        spark = job_session("amq-spark-streaming", master=args.master, remote=args.remote)
        try:
            produce = (
                spark.readStream.format("rate").option("rowsPerSecond", args.rate).load()
                .selectExpr("concat('tick-', cast(value as string)) AS body")
                .writeStream.format("amq")
                .option("uri", uri)
                .option("destination", "/queue/examples.stream.in")
                .option("checkpointLocation", str(root / "produce"))
                .trigger(processingTime="1 second")
                .start()
            )
            relay_writer = (
                spark.readStream.format("amq")
                .option("uri", uri)
                .option("destination", "/queue/examples.stream.in")
                .option("walPath", str(root / "relay" / "amq-wal"))
                .load()
                .selectExpr("upper(cast(body AS string)) AS body", "idempotency_key AS id")
                .writeStream.format("amq")
                .option("uri", uri)
                .option("destination", "/queue/examples.stream.out")
                .option("checkpointLocation", str(root / "relay"))
                .trigger(processingTime="1 second")
            )
            if args.id_prefix:
                relay_writer = relay_writer.option("idPrefix", args.id_prefix)
            relay = relay_writer.start()
            # Spark and its Python workers take a while to start on a busy machine: count the
            # run time from the producer's first rows.
            start_by = time.monotonic() + 180
            while not (produce.lastProgress and produce.lastProgress["numInputRows"]):
                for q in (produce, relay):
                    if q.exception() is not None:
                        raise SystemExit(f"query {q.name or q.id} failed: {q.exception()}")
                if time.monotonic() > start_by:
                    raise SystemExit("the producer query made no progress in 180 s")
                time.sleep(0.5)
            deadline = time.monotonic() + args.seconds
            while time.monotonic() < deadline:
                time.sleep(2)
                p, r = produce.lastProgress, relay.lastProgress
                print(
                    f"produced batch {p and p['batchId']}: {p and p['numInputRows']} rows | "
                    f"relayed batch {r and r['batchId']}: {r and r['numInputRows']} rows"
                )
            produce.stop()
            run_until_idle(relay)  # relay what the producer wrote before it stopped
            relay.stop()
            import amqtransport

            bodies: list[str] = []
            with amqtransport.connect(uri, dedupe=False) as conn:
                sub = conn.subscribe("/queue/examples.stream.out", prefetch=1000)
                while (msg := sub.receive(timeout=2.0)) is not None:
                    bodies.append(msg.text)
            print(f"/queue/examples.stream.out holds {len(bodies)} messages, {len(set(bodies))} distinct")
            print(f"checkpoints under {root}")
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
