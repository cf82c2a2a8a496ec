"""``amq demo``: the main job. A PySpark producer survives the loss of the master.

Theory of operation
-------------------
1. Start a broker cluster on 127.0.0.1 (free ports, a private temp dir): by default the
   embedded replicated pair (two ``amq broker run --ha replicated`` processes; the
   master's journal is replicated to the slave before a receipt); ``--cluster restart``
   uses one broker process killed and restarted on the same port and data directory.
2. Start a local SparkSession (``local[2,3]``) and write ``--rows`` rows
   (``body = "row-<i>"``) from ``--partitions`` partitions through
   ``failover:(...)`` with the ``amq`` data source.
3. A watcher thread prints progress (the messages the master holds, from its HA status;
   Spark's task counts) and SIGKILLs the master once ``--kill-at`` of the rows are
   stored (tasks are then mid-flight).
   A probe connection of this process, connected before the kill, measures the recovery
   time: from the kill to its first receipted send afterwards (same failover URI).
4. When the job has committed, consume the queue and count: consumed, distinct,
   duplicates, lost. Exit 0 only when lost == 0 and duplicates == 0.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import click

__all__ = ["demo", "DemoResult", "run_demo"]

QUEUE = "/queue/demo.spark.orders"
PROBE = "/queue/demo.probe"
WARMUP = "/queue/demo.warmup"


class Cluster(Protocol):
    description: str
    uri: str

    def kill_master(self) -> str: ...
    def after_kill(self) -> None: ...
    def new_master(self) -> str: ...
    def stored(self) -> int | None: ...
    def stop(self) -> None: ...


def _failover(addresses: list[str]) -> str:
    opts = "randomize=false&initialReconnectDelay=20&maxReconnectDelay=250&maxReconnectAttempts=-1"
    return f"failover:({','.join(addresses)})?{opts}"


class RestartedNode:
    """Interim cluster: one broker process, SIGKILLed and restarted on the same port/data dir."""

    def __init__(self, workdir: Path) -> None:
        from amqtransport.processes.broker import BrokerProcess

        self.proc = BrokerProcess(workdir / "node", port=0, log_dir=workdir / "node-log")
        self.proc.start()
        self.uri = _failover([f"tcp://127.0.0.1:{self.proc.port}"])
        self.description = (
            f"one embedded broker process (pid {self.proc.pid}, port {self.proc.port}), no slave: the "
            "'master kill' is a SIGKILL followed by a restart on the same port and data directory"
        )

    def kill_master(self) -> str:
        pid = self.proc.pid
        self.proc.kill()
        return f"SIGKILL broker pid {pid} (port {self.proc.port})"

    def after_kill(self) -> None:
        time.sleep(0.5)  # let the clients notice and retry at least once
        self.proc.restart()

    def new_master(self) -> str:
        return f"the same node, restarted (pid {self.proc.pid})"

    def stored(self) -> int | None:
        return None  # no status endpoint: progress comes from Spark's task counts

    def stop(self) -> None:
        self.proc.terminate()


class ReplicatedPair:
    """The embedded replicated pair: a master and an in-sync slave, each its own process."""

    def __init__(self, workdir: Path) -> None:
        from amqtransport.processes.pair import BrokerPair

        self.pair = BrokerPair("replicated", workdir / "pair")
        self.pair.start()
        master = self.pair.wait_master()
        slave = self.pair.other(master)
        self.uri = _failover([self.pair.a.uri, self.pair.b.uri])
        self.description = (
            f"embedded replicated pair: master {master.name} (pid {_pid(master)}, port {master.port}), "
            f"slave {slave.name} (pid {_pid(slave)}, port {slave.port}) in sync; own store each, "
            "journal replicated before a receipt"
        )

    def kill_master(self) -> str:
        node = self.pair.kill_master()
        return f"SIGKILL master {node.name} (pid {_pid(node)}, port {node.port}); slave takes over"

    def after_kill(self) -> None:
        pass  # the slave promotes itself; nothing to do

    def stored(self) -> int | None:
        """Messages held by the serving master (its ``amq-ha-messages`` status), None if none serves."""
        for node in self.pair.nodes:
            if node.alive:
                st = node.status(timeout=0.5)
                if st.get("amq-ha-role") == "master" and "amq-ha-messages" in st:
                    return int(st["amq-ha-messages"])
        return None

    def new_master(self) -> str:
        try:
            node = self.pair.wait_master(timeout=10)
        except TimeoutError:
            return "none"
        return f"{node.name} (port {node.port})"

    def stop(self) -> None:
        self.pair.stop()


def _pid(node: Any) -> int | None:
    proc = getattr(node, "proc", None)
    return None if proc is None else int(proc.pid)


def _start_cluster(workdir: Path, kind: str) -> Cluster:
    if kind == "pair":
        return ReplicatedPair(workdir)
    return RestartedNode(workdir)


@dataclass
class DemoResult:
    rows: int
    partitions: int
    cluster: str = ""
    killed: str = ""
    new_master: str = ""
    kill_at_seconds: float | None = None
    recovery_seconds: float | None = None
    write_seconds: float = 0.0
    receipted: int = 0
    retried_partitions: int = 0
    consumed: int = 0
    distinct: int = 0
    duplicates: int = 0
    lost: int = 0
    job_error: str | None = None
    progress: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.job_error is None and self.lost == 0 and self.duplicates == 0 and self.consumed == self.rows


def _short_error(exc: BaseException) -> str:
    """The root cause out of a Py4J/Spark error: its last ``SomeError: message`` line."""
    text = str(exc)
    causes = re.findall(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception|Exhausted|Timeout)): (.+)$", text, re.M)
    if causes:
        name, message = causes[-1]
        return f"{name}: {message.strip()[:400]}"
    return f"{type(exc).__name__}: {text.strip().splitlines()[0][:400] if text.strip() else ''}"


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        click.echo(text)
        sys.stdout.flush()


def _probe_recovery(conn: Any, killed_at: float, out: dict[str, float]) -> None:
    """From the kill to the first receipted send on a connection that was up before it."""
    try:
        conn.send(PROBE, b"probe", idempotency_key=f"probe-{killed_at}")
        out["recovered"] = time.monotonic() - killed_at
    except Exception as exc:  # noqa: BLE001 - reported, never fatal for the demo
        click.echo(f"  probe failed: {exc!r}", err=True)


def _stage_progress(sc: Any) -> tuple[int, int, int]:
    tracker = sc.statusTracker()
    total = done = active = 0
    for sid in tracker.getActiveStageIds():
        info = tracker.getStageInfo(sid)
        if info is not None:
            total += info.numTasks
            done += info.numCompletedTasks
            active += info.numActiveTasks
    return done, active, total


def _consume(uri: str, expected: int, idle: float, quiet: bool) -> tuple[int, set[str], int]:
    import amqtransport

    seen: set[str] = set()
    consumed = 0
    dup = 0
    last_print = time.monotonic()
    # dedupe=False: count what the queue really holds. The client's duplicate filter
    # would otherwise hide a copy stored twice by the broker, and the demo's claim is
    # about the broker (idempotency keys dropped at the queue), not about the consumer.
    with amqtransport.connect(uri, dedupe=False) as conn:
        sub = conn.subscribe(QUEUE, ack="auto", prefetch=1000)
        while True:
            msg = sub.receive(timeout=idle)
            if msg is None:
                break
            consumed += 1
            body = msg.text
            if body in seen:
                dup += 1
            seen.add(body)
            if time.monotonic() - last_print >= 1.0:
                _say(quiet, f"  consumed {consumed:,} / {expected:,}")
                last_print = time.monotonic()
    return consumed, seen, dup


def run_demo(
    rows: int = 100_000,
    partitions: int = 8,
    kill_at: float = 0.4,
    window: int = 200,
    master: str = "local[2,3]",
    quiet: bool = False,
    kill: bool = True,
    cluster_kind: str = "pair",
    spark: Any = None,
) -> DemoResult:
    """Run the demo; ``spark`` reuses a session (left running), else one is made and stopped."""
    from amqtransport.spark.session import local_session

    result = DemoResult(rows=rows, partitions=partitions)
    workdir = Path(tempfile.mkdtemp(prefix="amq-demo-"))
    cluster: Cluster | None = None
    own_session = spark is None
    try:
        _say(quiet, "== amq demo: a PySpark producer through failover:(...) while the master dies ==")
        cluster = _start_cluster(workdir, cluster_kind)
        result.cluster = cluster.description
        _say(quiet, f"cluster : {cluster.description}")
        _say(quiet, f"uri     : {cluster.uri}")
        _say(quiet, "spark   : starting a local session (first start takes a few seconds)...")
        if spark is None:
            spark = local_session(master=master, app="amq-demo")
        report = workdir / "commit-report.json"
        df = spark.range(0, rows, 1, partitions).selectExpr("concat('row-', cast(id as string)) AS body")
        writer = (
            df.write.format("amq")
            .mode("append")
            .option("uri", cluster.uri)
            .option("destination", QUEUE)
            .option("receiptWindow", str(window))
            .option("reportPath", str(report))
        )
        # Warm-up (not timed, not counted): the first Python data-source write pays for
        # starting Python workers and importing pyspark + amqtransport in them.
        spark.range(0, 10, 1, 2).selectExpr("cast(id AS string) AS body").write.format("amq").mode(
            "append"
        ).option("uri", cluster.uri).option("destination", WARMUP).save()
        _say(quiet, f"job     : write {rows:,} rows from {partitions} partitions to {QUEUE} (receipt window {window})")
        error: list[BaseException] = []
        state: dict[str, Any] = {"killed_at": None, "probe": None}
        probe: dict[str, float] = {}
        finished = threading.Event()

        import amqtransport

        # Connected (to the master) before the kill, like the job's own connections.
        probe_conn = amqtransport.connect(cluster.uri)
        probe_conn.send(PROBE, b"probe", idempotency_key="probe-start")
        baseline = cluster.stored()

        def watch() -> None:
            """Progress (messages the master holds, else Spark's task counts); the kill."""
            last_at = 0.0
            while not finished.wait(0.1):
                done, active, total = _stage_progress(spark.sparkContext)
                if not total:
                    continue
                held = cluster.stored()
                landed = None if held is None or baseline is None else max(0, held - baseline)
                elapsed = time.monotonic() - started
                tasks = f"tasks done {done}/{total}, running {active}"
                line = (
                    f"  {elapsed:6.1f}s  {tasks}"
                    if landed is None
                    else f"  {elapsed:6.1f}s  {landed:>7,} / {rows:,} rows stored on the master; {tasks}"
                )
                result.progress.append(
                    {"t": round(elapsed, 2), "done": done, "running": active, "total": total, "stored": landed}
                )
                if time.monotonic() - last_at >= 1.0:
                    _say(quiet, line)
                    last_at = time.monotonic()
                if landed is not None:
                    due = landed >= rows * kill_at
                else:
                    due = done >= max(1, int(total * kill_at))
                if kill and state["killed_at"] is None and due and done < total:
                    what = cluster.kill_master()
                    killed_at = state["killed_at"] = time.monotonic()
                    result.killed = what
                    result.kill_at_seconds = round(killed_at - started, 2)
                    progress = f"{landed:,} rows stored" if landed is not None else f"{done}/{total} tasks done"
                    _say(quiet, f"  {elapsed:6.1f}s  KILL: {what} ({progress}, {active} task(s) mid-flight)")
                    state["probe"] = threading.Thread(
                        target=_probe_recovery, args=(probe_conn, killed_at, probe), daemon=True
                    )
                    state["probe"].start()
                    cluster.after_kill()

        started = time.monotonic()
        watcher = threading.Thread(target=watch, name="amq-demo-watch", daemon=True)
        watcher.start()
        try:
            writer.save()  # in this thread: the data source is registered on this thread's session
        except Exception as exc:  # noqa: BLE001 - reported below
            error.append(exc)
        finally:
            finished.set()
            watcher.join(30)
        killed_at = state["killed_at"]
        probe_thread = state["probe"]
        result.write_seconds = round(time.monotonic() - started, 2)
        if kill and killed_at is None:
            _say(quiet, "  note: the job finished before the kill point; no kill happened (use more --rows)")
        if probe_thread is not None:
            probe_thread.join(60)
            if "recovered" in probe:
                result.recovery_seconds = round(probe["recovered"], 3)
        probe_conn.close()
        if killed_at is not None:
            result.new_master = cluster.new_master()
        if error:
            result.job_error = _short_error(error[0])
            if os.environ.get("AMQ_DEMO_DEBUG"):
                click.echo(str(error[0]), err=True)
            _say(quiet, f"job FAILED: {result.job_error}")
        else:
            summary = json.loads(report.read_text()) if report.exists() else {}
            result.receipted = int(summary.get("rows", 0))
            result.retried_partitions = int(summary.get("retried_partitions", 0))
            _say(quiet, f"job     : committed in {result.write_seconds:.1f}s; every task waited for all its receipts")
        _say(quiet, "consume : draining the queue through the same failover URI ...")
        consumed, seen, dup = _consume(cluster.uri, rows, idle=3.0, quiet=quiet)
        expected = {f"row-{i}" for i in range(rows)}
        result.consumed = consumed
        result.distinct = len(seen)
        result.duplicates = dup
        result.lost = len(expected - seen)
        return result
    finally:
        if own_session and spark is not None:
            try:
                spark.stop()
            except Exception:  # noqa: BLE001
                pass
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _print_result(r: DemoResult) -> None:
    rec = "n/a" if r.recovery_seconds is None else f"{r.recovery_seconds:.3f} s (kill -> next receipted send of a connection that was up)"
    lines = [
        "",
        "== result ==",
        f"rows written     : {r.rows:,} (from {r.partitions} partitions)",
        f"receipted        : {r.receipted:,} (sum of the successful tasks' commit messages; {r.retried_partitions} task(s) were retries)",
        f"consumed         : {r.consumed:,}",
        f"duplicates       : {r.duplicates:,}",
        f"lost             : {r.lost:,}",
        f"master killed    : {r.killed or 'no'}" + (f" at {r.kill_at_seconds:.1f}s" if r.kill_at_seconds is not None else ""),
        f"serving now      : {r.new_master or 'n/a'}",
        f"recovery time    : {rec}",
        f"write job        : {r.write_seconds:.1f} s" + (f"  FAILED: {r.job_error}" if r.job_error else ""),
        f"verdict          : {'OK: nothing lost, nothing duplicated' if r.ok else 'FAILED'}",
    ]
    click.echo("\n".join(lines))


@click.command("demo")
@click.option("--rows", default=100_000, show_default=True, help="Rows to write.")
@click.option("--partitions", default=8, show_default=True, help="Spark partitions (one connection each).")
@click.option(
    "--kill-at",
    default=0.4,
    show_default=True,
    help="Kill the master when this fraction of the rows is stored (of the tasks done, without a status endpoint).",
)
@click.option("--window", default=200, show_default=True, help="receiptWindow of the writer.")
@click.option("--master", default="local[2,3]", show_default=True, help="Spark master.")
@click.option("--no-kill", is_flag=True, help="Do not kill anything (baseline).")
@click.option(
    "--cluster",
    "cluster_kind",
    type=click.Choice(["pair", "restart"]),
    default="pair",
    show_default=True,
    help="pair: the embedded replicated pair (master killed, slave takes over); "
    "restart: one node killed and restarted on the same port.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON at the end.")
def demo(
    rows: int, partitions: int, kill_at: float, window: int, master: str, no_kill: bool, cluster_kind: str, as_json: bool
) -> None:
    """Spark producer surviving a master kill: rows written, receipted, consumed, duplicates, lost."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    result = run_demo(
        rows=rows,
        partitions=partitions,
        kill_at=kill_at,
        window=window,
        master=master,
        kill=not no_kill,
        cluster_kind=cluster_kind,
    )
    _print_result(result)
    if as_json:
        click.echo(json.dumps(result.__dict__ | {"ok": result.ok}, default=str))
    sys.exit(0 if result.ok else 1)
