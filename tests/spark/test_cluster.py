"""The ``amq`` data source on a real Spark standalone cluster, and through Spark Connect.

One cluster for this module, so one per test session (all cluster tests live here): a
master and two 1-core workers from the pip pyspark, each its own JVM
(:class:`amqtransport.testing.spark_cluster.SparkCluster`; about 2.5 GB with a job
running). Jobs are ``spark-submit`` subprocesses in client mode running the examples
unchanged, as a user would. Marked ``spark_cluster``: ``-m spark_cluster`` selects these,
``-m "not spark_cluster"`` leaves them out. They run one at a time (the module's tests
are sequential and each waits for its job).

Counting consumers use ``dedupe=False`` (see ``spark_helpers.drain``), so a copy stored
twice by the broker is counted twice.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spark_helpers import drain, failover, queue

import amqtransport
from amqtransport.testing.spark_cluster import (
    ConnectServer,
    SparkCluster,
    Submission,
    missing_reason,
)

pytestmark = [pytest.mark.spark, pytest.mark.spark_cluster, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def bare_python() -> str | None:
    """An interpreter of this Python's minor version that cannot import amqtransport (nor pydantic's core)."""
    want = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [f"/usr/bin/{want}", f"/usr/local/bin/{want}", getattr(sys, "_base_executable", None),
                  shutil.which(want)]
    probe = (f"import sys; assert sys.version_info[:2] == {tuple(sys.version_info[:2])!r}; print('version ok'); "
             "import amqtransport")
    for candidate in candidates:
        if not candidate or not os.path.exists(candidate):
            continue
        done = subprocess.run([candidate, "-c", probe], capture_output=True, text=True, cwd="/", env={"PATH": "/usr/bin:/bin"})
        if "version ok" in done.stdout and "No module named 'amqtransport'" in done.stderr:
            return candidate
    return None


@pytest.fixture(scope="module")
def bare_interpreter() -> str | None:
    return bare_python()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, bare_interpreter: str | None) -> Iterator[SparkCluster]:
    """Master + 2 workers. Packed envs run on them with a Python that lacks the library: the
    launcher's interpreter (``$AMQ_ENV_PYTHON``) is a wrapper around ``bare_python()`` that
    records each call (its directory and arguments) in ``<workdir>/bare-python.calls``."""
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    workdir = tmp_path_factory.mktemp("spark-cluster")
    env: dict[str, str] = {}
    if bare_interpreter is not None:
        recorder = workdir / "bare-python"
        recorder.write_text(
            f'#!/bin/sh\necho "$(pwd -P) :: $*" >> {workdir / "bare-python.calls"}\nexec {bare_interpreter} "$@"\n')
        recorder.chmod(0o755)
        env["AMQ_ENV_PYTHON"] = str(recorder)
    with SparkCluster(workdir, workers=2, cores=1, memory="2g", env=env) as c:
        yield c


def wait_stored(pair: Any, at_least: int, job: Submission, timeout: float = 300.0) -> int:
    """Wait until the serving master holds ``at_least`` messages (its HA status); the job must keep running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not job.running:
            raise AssertionError(f"the job ended before {at_least} rows were stored:\n{job.wait(1).stdout}")
        for node in pair.nodes:
            st = node.status(timeout=0.5) if node.alive else {}
            if st.get("amq-ha-role") == "master" and int(st.get("amq-ha-messages", "0")) >= at_least:
                return int(st["amq-ha-messages"])
        time.sleep(0.05)
    raise AssertionError(f"fewer than {at_least} rows stored within {timeout} s")


def order_ids(messages: list[Any]) -> list[int]:
    return [json.loads(m.text)["order"] for m in messages]


def test_broker_master_and_executor_sigkill_in_one_job_land_exactly_n(cluster: SparkCluster, tmp_path: Path) -> None:
    """examples/spark_producer.py on the cluster through the replicated pair's failover URI; once
    a fifth of the rows are stored, SIGKILL the broker master and one executor JVM."""
    from amqtransport.testing.broker_pair import BrokerPair

    n, parts, dest = 60_000, 8, queue()
    report = tmp_path / "report.json"
    with BrokerPair("replicated", tmp_path / "pair") as pair:
        uri = failover(pair.a, pair.b) + "&maxReconnectAttempts=-1"
        job = cluster.start_submit(EXAMPLES / "spark_producer.py", [
            "--uri", uri, "--rows", str(n), "--partitions", str(parts), "--destination", dest,
            "--report", str(report), "--window", "100", "--json"])
        try:
            wait_stored(pair, n // 5, job)
            executors = cluster.executor_pids()
            assert len(executors) == 2, f"expected an executor on each worker, found {executors}"
            killed_node = pair.kill_master()
            cluster.kill_executor(executors[0])
            result = job.wait(timeout=450).check()
        finally:
            job.stop()
        assert not killed_node.alive and pair.wait_master(timeout=30) is not killed_node
        got = drain(uri, dest)
    summary = json.loads(report.read_text())
    assert summary["status"] == "committed" and summary["rows"] == n and summary["partitions"] == parts
    assert summary["retried_partitions"] >= 1, f"the executor kill hit no running task: {summary}"
    assert executors[0] not in cluster.executor_pids()
    ids = order_ids(got)
    assert len(ids) == n, f"{len(ids)} messages for {n} rows ({len(ids) - len(set(ids))} duplicates)"
    assert set(ids) == set(range(n))
    assert json.loads(result.stdout.strip().splitlines()[-1])["rows"] == n


def test_shipped_env_runs_where_the_executor_python_lacks_the_library(
    cluster: SparkCluster, bare_interpreter: str | None, tmp_path: Path
) -> None:
    """`amq spark pack-env` builds the wheel and the slim env; the spark-submit line it prints
    runs the producer on the cluster, where every Python (driver side included) is one without
    the library. Exactly N rows."""
    if bare_interpreter is None:
        pytest.skip(f"no python{sys.version_info.major}.{sys.version_info.minor} without amqtransport on this "
                    "machine to stand for a bare executor Python")
    from amqtransport.broker import EmbeddedBroker

    pack = tmp_path / "pack"
    built = subprocess.run(
        [sys.executable, "-m", "amqtransport", "spark", "pack-env", "--out", str(pack), "--master", cluster.master_url,
         "--app", str(EXAMPLES / "spark_producer.py"), "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    info = json.loads(built.stdout)
    env_dir = Path(info["env"])
    assert not (env_dir / "site-packages" / "pyspark").exists()  # Spark ships pyspark.zip itself
    assert info["archive_bytes"] < 120e6, info
    launcher = env_dir / "bin" / "python"
    assert not launcher.is_symlink()
    assert sys.prefix not in launcher.read_text() and sys.base_prefix not in launcher.read_text()

    n, dest = 20_000, queue()
    with EmbeddedBroker(data_dir=tmp_path / "broker") as broker:
        uri = failover(broker)
        line = info["submit"] + " " + shlex.join(
            ["--uri", uri, "--rows", str(n), "--partitions", "4", "--destination", dest, "--json"])
        env = dict(cluster.env)
        env["PATH"] = f"{cluster.home / 'bin'}{os.pathsep}{env.get('PATH', '')}"  # spark-submit, as a user has it
        env.pop("PYSPARK_PYTHON", None)
        env.pop("PYSPARK_DRIVER_PYTHON", None)
        ran = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=450, env=env, cwd=tmp_path)
        assert ran.returncode == 0, f"{line}\n{ran.stdout[-3000:]}\n{ran.stderr[-6000:]}"
        got = drain(uri, dest)
    assert sorted(order_ids(got)) == list(range(n))
    calls = (cluster.workdir / "bare-python.calls").read_text().splitlines()
    executor_calls = [c for c in calls if "/app-" in c.split(" :: ")[0]]
    assert executor_calls, f"no executor ran the bare interpreter: {calls}"
    assert any("pyspark.daemon" in c or "pyspark.worker" in c for c in executor_calls), executor_calls
    # the other calls: the driver's Python and its planning workers, in the submit directory
    assert all(c.split(" :: ")[0] == str(env_dir.parent.resolve()) for c in calls if c not in executor_calls), calls


def test_spark_connect_write_lands_exactly_n(cluster: SparkCluster, tmp_path: Path) -> None:
    """A Connect server from the pip package on the cluster (its Python has the library); the
    client is examples/spark_producer.py --remote in a process with the connect extras."""
    pytest.importorskip("grpc", reason="the spark-connect extra (pyspark[connect]) is not installed")
    from amqtransport.broker import EmbeddedBroker

    n, dest = 20_000, queue()
    report = tmp_path / "report.json"
    with EmbeddedBroker(data_dir=tmp_path / "broker") as broker, \
            ConnectServer(cluster, tmp_path / "connect", python=sys.executable, cores_max=2) as server:
        uri = failover(broker)
        ran = subprocess.run(
            [sys.executable, str(EXAMPLES / "spark_producer.py"), "--remote", server.url, "--uri", uri,
             "--rows", str(n), "--partitions", "4", "--destination", dest, "--report", str(report), "--json"],
            capture_output=True, text=True, timeout=300,
        )
        assert ran.returncode == 0, f"{ran.stdout[-3000:]}\n{ran.stderr[-4000:]}\n{server.log_text()[-4000:]}"
        got = drain(uri, dest)
    assert sorted(order_ids(got)) == list(range(n))
    summary = json.loads(report.read_text())  # written by the commit on the server's driver
    assert summary["rows"] == n and summary["status"] == "committed"


def test_streaming_relay_on_the_cluster_delivers_every_row_exactly_once(cluster: SparkCluster, tmp_path: Path) -> None:
    """examples/spark_relay.py (the documented recipe: the input's idempotency key as the id
    column, no idPrefix) from one queue to another on the same broker: every row exactly once,
    the input acked empty. A broker whose duplicate window ignores the destination drops them all."""
    from amqtransport.broker import EmbeddedBroker

    n, qin, qout = 5_000, queue(), queue()
    with EmbeddedBroker(data_dir=tmp_path / "broker") as broker:
        uri = failover(broker)
        with amqtransport.connect(uri) as conn, conn.producer(window=200) as producer:
            for i in range(n):
                producer.send(qin, f"m-{i}", idempotency_key=f"order-{i}")
        result = cluster.submit(EXAMPLES / "spark_relay.py", [
            "--uri", uri, "--input", qin, "--output", qout, "--checkpoint", str(tmp_path / "ckpt"),
            "--upper", "--max-batch", "1000", "--trigger", "500 milliseconds", "--until-idle"], timeout=450).check()
        got = drain(uri, qout)
        left = drain(uri, qin, idle=1.0)
    assert len(got) == n, f"{len(got)} of {n} rows relayed; driver:\n{result.stdout[-2000:]}"
    assert sorted(m.text for m in got) == sorted(f"M-{i}" for i in range(n))
    assert sorted(m.idempotency_key for m in got) == sorted(f"order-{i}" for i in range(n))
    assert left == []
