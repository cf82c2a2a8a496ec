"""Rows/s of the ``amq`` data source on a Spark standalone cluster vs ``local[2]``, and with 1, 2, 4 executors.

Same broker process (``amq broker run``, fsync on), same machine, same run, same job:
``spark.range(rows, 8 partitions)`` written with ``df.write.format("amq")`` (persistent,
receipt window 200), timed around ``save()`` after an untimed warm-up write, ``rounds``
rounds per application (each to its own queue, drained untimed after the run). The
warm-up writes 16 partitions once every executor is registered, so each executor's
Python workers are running before the first timed round. Every
configuration is its own ``spark-submit`` application of this file (``--job``), in this
order: ``local[2]``, cluster with 2 executors, ``local[2]`` again, cluster with 1
executor, cluster with 4 executors. The cluster: a master and 2 workers with 2 cores
each (``SparkCluster``); ``spark.executor.cores=1`` and ``spark.cores.max=N`` give N
one-core executors, spread over the workers. Reported: the median rows/s of each
configuration, the ratio cluster(2 executors) / local[2] (local's median over both of
its applications), and the broker's CPU use during the timed writes (CPU seconds of
the broker process / wall seconds: near 1.0 the single-threaded broker is the limit).

    .venv/bin/python benchmarks/bench_spark_cluster.py        # AMQ_BENCH_QUICK=1 for a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table, quick, scale, work_dir, write_result  # noqa: E402
from bench_spark import drain_count  # noqa: E402

WINDOW = 200
PARTITIONS = 8


def _label(executors: int | None) -> str:
    if executors is None:
        return "local[2]"
    return f"cluster, {executors} executor" + ("s" if executors > 1 else "")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def job(args: argparse.Namespace) -> None:
    """Runs under spark-submit: warm up, then ``rounds`` timed writes; one JSON line per round."""
    from amqtransport.spark.session import job_session

    spark = job_session("amq-bench-spark-cluster")
    try:
        # warm-up: every executor starts its Python workers (all are registered first: minRegisteredResourcesRatio)
        spark.range(0, 1000, 1, 2 * PARTITIONS).selectExpr("cast(id as string) AS body").write.format("amq").mode(
            "append").option("uri", args.uri).option("destination", f"{args.queue}.warmup").save()
        for r in range(args.rounds):
            df = spark.range(0, args.rows, 1, PARTITIONS).selectExpr("concat('row-', cast(id as string)) AS body")
            w = (df.write.format("amq").mode("append").option("uri", args.uri)
                 .option("destination", f"{args.queue}.{r}").option("receiptWindow", str(WINDOW)))
            cpu0, t0 = _cpu_seconds(args.broker_pid), time.perf_counter()
            w.save()
            took, cpu = time.perf_counter() - t0, _cpu_seconds(args.broker_pid) - cpu0
            print("ROUND " + json.dumps({"round": r, "rows": args.rows, "seconds": took, "rows_per_s": args.rows / took,
                                         "broker_cpu": cpu / took}), flush=True)
    finally:
        spark.stop()


def main() -> None:
    from amqtransport.testing.broker_process import BrokerProcess
    from amqtransport.testing.spark_cluster import SparkCluster, missing_reason

    reason = missing_reason()
    if reason:
        raise SystemExit(f"bench_spark_cluster: {reason}")
    rows = scale(100_000, 10_000)
    rounds = 1 if quick() else 3
    workdir = work_dir("amq-bench-spark-cluster-")
    configs: list[tuple[str | None, int | None]] = [
        ("local[2]", None), (None, 2), ("local[2]", None), (None, 1), (None, 4)]
    results: dict[str, list[dict[str, float]]] = {}
    with BrokerProcess(workdir / "broker", port=0) as broker, \
            SparkCluster(workdir / "cluster", workers=2, cores=2, memory="4g") as cluster:
        uri = f"failover:({broker.uri})?randomize=false"
        for n, (master, executors) in enumerate(configs):
            label = _label(executors)
            queue = f"/queue/bench.cluster.{n}"
            app_args = ["--job", "--uri", uri, "--queue", queue, "--rows", str(rows), "--rounds", str(rounds),
                        "--broker-pid", str(broker.pid)]
            conf: dict[str, str] = {}
            if executors is not None:
                conf = {"spark.executor.cores": "1", "spark.cores.max": str(executors), "spark.executor.memory": "1g",
                        "spark.scheduler.minRegisteredResourcesRatio": "1.0"}
            print(f"== {label}: {rounds} round(s) of {rows:,} rows ...", flush=True)
            result = cluster.submit(__file__, app_args, conf=conf, master=master, timeout=900).check()
            got = [json.loads(line[len("ROUND "):]) for line in result.stdout.splitlines() if line.startswith("ROUND ")]
            if len(got) != rounds:
                raise SystemExit(f"{label}: expected {rounds} rounds, got {got}\n{result.stdout[-2000:]}")
            for r in range(rounds):
                landed = drain_count(uri, f"{queue}.{r}", rows)
                if landed != rows:
                    raise SystemExit(f"{label} round {r}: {landed} of {rows} rows landed")
            for g in got:
                print(f"   {g['rows_per_s']:,.0f} rows/s, broker CPU {g['broker_cpu']:.2f}", flush=True)
            results.setdefault(label, []).extend(got)

    def med(label: str, key: str = "rows_per_s") -> float:
        return statistics.median(g[key] for g in results[label])

    local = med("local[2]")
    table = [
        {
            "configuration": label,
            "rows/s (median)": med(label),
            "vs local[2]": med(label) / local,
            "broker CPU (cores)": med(label, "broker_cpu"),
            "rounds rows/s": ", ".join(f"{g['rows_per_s']:,.0f}" for g in results[label]),
        }
        for label in ("local[2]", _label(1), _label(2), _label(4))
    ]
    print_table(table, title=f"amq data source: standalone cluster vs local[2], {rows:,} rows x {PARTITIONS} partitions")
    ratio = med(_label(2)) / local
    write_result(
        "spark_cluster",
        table,
        headline={"cluster(2 ex)/local[2]": round(ratio, 2),
                  "rows/s 1/2/4 ex": "/".join(f"{med(_label(n)):,.0f}" for n in (1, 2, 4))},
        notes=f"persistent sends, receipt window {WINDOW}, one broker process (fsync on); 2 workers x 2 cores; "
              f"{rounds} rounds per application; local[2] median over 2 applications",
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--uri")
    ap.add_argument("--queue")
    ap.add_argument("--rows", type=int)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--broker-pid", type=int)
    ns = ap.parse_args()
    if ns.job:
        job(ns)
    else:
        main()
