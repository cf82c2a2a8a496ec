"""Relay one queue to another through Spark Structured Streaming, every row exactly once.

    # on a standalone cluster (spark-submit decides the master; the checkpoint must be durable)
    spark-submit --master spark://host:7077 examples/spark_relay.py \\
        --uri "failover:(tcp://mq1:61613,tcp://mq2:61613)?randomize=false" \\
        --input /queue/orders.in --output /queue/orders.out --checkpoint /durable/chk/orders-relay
    # locally, until the input queue is drained
    .venv/bin/python examples/spark_relay.py --uri tcp://127.0.0.1:61613 --input in --output out --until-idle

The relay recipe (docs/spark.md, "The relay pattern"):

    (spark.readStream.format("amq").option("uri", URI).option("destination", IN)
        .option("walPath", CHECKPOINT + "/amq-wal").load()
        .selectExpr("<your transform of body> AS body", "idempotency_key AS id")
        .writeStream.format("amq").option("uri", URI).option("destination", OUT)
        .option("checkpointLocation", CHECKPOINT).start())

The reader is at-least-once (a message is acked only after the micro-batch holding it is
committed); writing each row with the input message's idempotency key (the ``id``
column) makes every copy of a row that a replay or a retried task sends carry the same
key, so the output queue keeps one. The key is reused at another destination, which is
right where the broker scopes its duplicate window by destination (ours, and Artemis
per address). ``--id-prefix`` makes the output keys ``<prefix>-<key>``: use it when the
output is the input destination itself, or on a broker whose window is global.

``--until-idle`` stops once the input is drained: no micro-batch has brought a row for
``--idle-seconds`` (``amqtransport.spark.idle.run_until_idle``; a single
``processAllAvailable()`` can return while a slow broker still holds messages); without
it the relay runs until Ctrl-C (or SIGTERM), then stops the query cleanly.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", required=True, help="connection URI of the broker (both queues)")
    ap.add_argument("--input", required=True, help="queue to read (at-least-once)")
    ap.add_argument("--output", required=True, help="destination to write (exactly once with a deduplicating broker)")
    ap.add_argument("--checkpoint", required=True, help="checkpoint directory (durable; the WAL goes to <it>/amq-wal)")
    ap.add_argument("--id-prefix", default=None, help="output keys become <prefix>-<input key>")
    ap.add_argument("--upper", action="store_true", help="the transform: upper-case the body (default: unchanged)")
    ap.add_argument("--max-batch", type=int, default=10_000, help="messages per micro-batch at most")
    ap.add_argument("--trigger", default="1 second", help="processing-time trigger")
    ap.add_argument("--until-idle", action="store_true", help="stop once the input queue is drained")
    ap.add_argument("--idle-seconds", type=float, default=3.0,
                    help="with --until-idle: drained means no row for this long [default: 3]")
    ap.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[2,3])")
    ap.add_argument("--remote", default=None, help="Spark Connect URL (the WAL and checkpoint are then the server's)")
    args = ap.parse_args()

    from amqtransport.spark.idle import run_until_idle
    from amqtransport.spark.session import job_session

    spark = job_session("amq-spark-relay", master=args.master, remote=args.remote)
    body = "upper(cast(body AS string))" if args.upper else "body"
    writer = (
        spark.readStream.format("amq")
        .option("uri", args.uri)
        .option("destination", args.input)
        .option("walPath", args.checkpoint.rstrip("/") + "/amq-wal")
        .option("maxBatchSize", str(args.max_batch))
        .option("prefetch", str(args.max_batch))
        .load()
        .selectExpr(f"{body} AS body", "idempotency_key AS id")
        .writeStream.format("amq")
        .option("uri", args.uri)
        .option("destination", args.output)
        .option("checkpointLocation", args.checkpoint)
        .trigger(processingTime=args.trigger)
    )
    if args.id_prefix:
        writer = writer.option("idPrefix", args.id_prefix)
    query = writer.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    started = time.monotonic()
    try:
        if args.until_idle:
            run_until_idle(query, args.idle_seconds)
        else:
            while not stop.wait(5.0):
                if query.exception() is not None:
                    raise SystemExit(f"relay failed: {query.exception()}")
                p = query.lastProgress
                if p:
                    print(f"batch {p['batchId']}: {p['numInputRows']} rows", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        relayed = sum(int(p["numInputRows"]) for p in query.recentProgress)
        query.stop()
        spark.stop()
    print(json.dumps({"relayed_rows_recent_batches": relayed, "seconds": round(time.monotonic() - started, 1),
                      "input": args.input, "output": args.output}))


if __name__ == "__main__":
    main()
