"""The Spark producer against an ActiveMQ Classic master/slave pair.

    # against a pair you run yourself:
    .venv/bin/python examples/spark_activemq.py --uri "failover:(tcp://mq1:61613,tcp://mq2:61613)?randomize=false"
    # or start a local shared-store pair (Debian's /usr/share/activemq + Java 17) and kill its master mid-job:
    .venv/bin/python examples/spark_activemq.py --start-pair --kill-master

ActiveMQ *Classic* does not deduplicate on a header, so against it the writer is
at-least-once: a Spark task retry, or a send replayed by failover whose receipt was lost
with the old master, can leave a duplicate (the consumer side's message audit, or an
``id`` column and an idempotent consumer, removes it). Artemis deduplicates on
``_AMQ_DUPL_ID``, which our client stamps too: exactly-once at the queue there, as with
our own broker. The script counts what landed and says which it saw.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", help="failover URI of a running ActiveMQ pair")
    ap.add_argument("--start-pair", action="store_true", help="start a local shared-store pair")
    ap.add_argument("--kill-master", action="store_true", help="SIGKILL the master after --kill-after seconds")
    ap.add_argument("--kill-after", type=float, default=5.0)
    ap.add_argument("--rows", type=int, default=5_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--destination", default="/queue/examples.spark.activemq")
    args = ap.parse_args()
    if not args.uri and not args.start_pair:
        ap.error("give --uri of a running pair, or --start-pair")

    import amqtransport
    from amqtransport.spark.session import local_session

    pair = None
    if args.start_pair:
        from amqtransport.processes.activemq import ActiveMQPair, missing_reason

        reason = missing_reason()
        if reason:
            raise SystemExit(f"cannot start ActiveMQ here: {reason}")
        pair = ActiveMQPair(Path(tempfile.mkdtemp(prefix="amq-activemq-pair-")))
        pair.start()
        uri = pair.uri + "&maxReconnectDelay=1000"
        print(f"started an ActiveMQ pair: {uri}")
    else:
        uri = args.uri
    spark = None
    try:
        spark = local_session(app="amq-spark-activemq")
        df = spark.range(0, args.rows, 1, args.partitions).selectExpr("concat('row-', cast(id as string)) AS body")
        if pair is not None and args.kill_master:
            def killer() -> None:
                time.sleep(args.kill_after)
                node = pair.kill_master()
                print(f"killed the ActiveMQ master (pid was {node.pid}); the slave takes over")

            threading.Thread(target=killer, daemon=True).start()
        started = time.perf_counter()
        df.write.format("amq").mode("append").option("uri", uri).option("destination", args.destination).save()
        print(f"wrote {args.rows:,} rows in {time.perf_counter() - started:.1f}s, every one receipted")
        seen: dict[str, int] = {}
        with amqtransport.connect(uri, dedupe=False) as conn:
            sub = conn.subscribe(args.destination, prefetch=1000)
            while (msg := sub.receive(timeout=5.0)) is not None:
                seen[msg.text] = seen.get(msg.text, 0) + 1
        dups = sum(n - 1 for n in seen.values())
        lost = args.rows - len(seen)
        print(f"consumed {sum(seen.values()):,}: distinct {len(seen):,}, duplicates {dups}, lost {lost}")
    finally:
        if spark is not None:
            spark.stop()
        if pair is not None:
            pair.stop()


if __name__ == "__main__":
    main()
