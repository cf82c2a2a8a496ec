"""A real Spark standalone cluster from the pip ``pyspark`` package, for tests and benchmarks.

Theory of operation
-------------------
pip's pyspark ships ``bin/spark-class``, ``bin/spark-submit`` and
``sbin/start-connect-server.sh`` (not ``start-master.sh``), so :class:`SparkCluster`
starts each daemon as its own JVM with ``spark-class`` (which ``exec``s java: the pid we
hold is the JVM's):

- the master: ``org.apache.spark.deploy.master.Master --host 127.0.0.1 --port 0
  --webui-port 0`` (its REST submission server, on a fixed port by default, is off);
  its URL comes from the log line "Starting Spark master at spark://...", and it is
  ready at "I have been elected leader";
- ``workers`` workers: ``org.apache.spark.deploy.worker.Worker <master> --cores C
  --memory M --work-dir DIR --webui-port 0``, started together, each ready at
  "Successfully registered with master".

Readiness comes from those log lines (each JVM's stdout and stderr go to one log file
under ``workdir/logs``), never from sleeps. Every JVM is stopped by its pid (SIGTERM,
then SIGKILL), executors included; when started from the main thread each daemon is
wrapped by ``setpriv --pdeathsig KILL`` (which ``exec``s, keeping the pid), so a test
process that dies hard takes its cluster with it.

Jobs run as ``spark-submit`` subprocesses (:meth:`SparkCluster.submit`), in client mode
(the only deploy mode for Python apps on standalone), because a process holding a
local SparkSession cannot start a second SparkContext. Executors are children of the
worker JVMs: :meth:`SparkCluster.executor_pids` finds them in ``/proc`` so a test can
SIGKILL one mid-job. :class:`ConnectServer` runs a Spark Connect server on the cluster
the way the docs tell users to (``sbin/start-connect-server.sh``: a daemon whose pid is
in ``SPARK_PID_DIR``), ready at "Spark Connect server started".

Memory, one master and two 1-core workers with one job: about 2.5 GB (master and
workers about 240 MB each, an executor about 300 MB, the driver about 400 MB, Python
workers 0.5-0.9 GB). Keep one cluster per test session.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from amqtransport.processes.ports import free_port
from amqtransport.processes.spawn import read_log

__all__ = [
    "ConnectServer",
    "SparkCluster",
    "SparkDaemon",
    "SubmitResult",
    "missing_reason",
    "spark_home",
]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> Path | None:
    """The installed pyspark package directory (it is a SPARK_HOME), or None."""
    try:
        import pyspark
    except ImportError:
        return None
    home = Path(pyspark.__file__).resolve().parent
    return home if (home / "bin" / "spark-class").exists() else None


def missing_reason() -> str | None:
    """Why a cluster cannot run here (for a pytest skip), or None when it can."""
    if spark_home() is None:
        return "pyspark (with bin/spark-class) is not installed: pip install -e '.[spark]'"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no java on PATH (and JAVA_HOME unset); Spark needs Java 17"
    return None


def spark_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for Spark's scripts: SPARK_HOME = the pip pyspark, 127.0.0.1 only."""
    home = spark_home()
    if home is None:
        raise RuntimeError(missing_reason() or "pyspark is not installed")
    env = dict(os.environ)
    env["SPARK_HOME"] = str(home)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env.pop("SPARK_CONF_DIR", None)
    env.update(extra or {})
    return env


def _pdeathsig(cmd: list[str]) -> list[str]:
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return cmd
    return [setpriv, "--pdeathsig", "KILL", "--", *cmd]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is not alive
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return not _alive(pid)


def _children(ppid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live children of ``ppid`` (Linux ``/proc``)."""
    out: list[tuple[int, str]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if int(fields[1]) != ppid or fields[0] == "Z":
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except (OSError, IndexError, ValueError):
            continue
        out.append((int(entry), cmdline))
    return out


class SparkDaemon:
    """One Spark JVM started by ``spark-class``; stdout and stderr go to ``log_path``."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str], cwd: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} not started"
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                _pdeathsig(self.argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )

    def log_text(self) -> str:
        return read_log(self.log_path)

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        """The first match of ``pattern`` in the log; RuntimeError (with the log) if it never comes."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            found = regex.search(self.log_text())
            if found:
                return found
            if not self.alive:
                raise RuntimeError(f"{self.name} exited (code {self.proc and self.proc.poll()}) before "
                                   f"logging {pattern!r}; log:\n{self.log_text()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not log {pattern!r} within {timeout:.0f} s; "
                                   f"log:\n{self.log_text()[-4000:]}")
            time.sleep(0.1)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM by pid, SIGKILL after ``timeout``; always reaped."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


@dataclass
class SubmitResult:
    """What a finished ``spark-submit`` left: its exit code and its output (driver log included)."""

    returncode: int
    stdout: str
    log: str
    seconds: float

    def check(self) -> SubmitResult:
        if self.returncode != 0:
            raise AssertionError(
                f"spark-submit exited {self.returncode} after {self.seconds:.0f} s\n--- stdout ---\n"
                f"{self.stdout[-4000:]}\n--- log ---\n{self.log[-8000:]}"
            )
        return self


class Submission:
    """A running ``spark-submit`` (its own process group, so a timeout can stop the driver's Python too)."""

    def __init__(self, proc: subprocess.Popen[bytes], out_path: Path, log_path: Path) -> None:
        self.proc = proc
        self.out_path = out_path
        self.log_path = log_path
        self.started = time.monotonic()

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return read_log(self.out_path)

    def wait(self, timeout: float) -> SubmitResult:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            code = -9
        return SubmitResult(code, self.output(), read_log(self.log_path), time.monotonic() - self.started)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the group we created for this submit
            except ProcessLookupError:
                pass
            self.proc.wait(30)


class SparkCluster:
    """A standalone master and ``workers`` workers; a context manager that always stops them."""

    def __init__(
        self,
        workdir: str | Path,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "2g",
        startup_timeout: float = 120.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.n_workers = workers
        self.cores = cores
        self.memory = memory
        self.startup_timeout = startup_timeout
        self.env = spark_env(
            {
                # off: the REST submission server binds a fixed port (6066) by default
                "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
                **(env or {}),
            }
        )
        self.master: SparkDaemon | None = None
        self.workers: list[SparkDaemon] = []
        self.master_url = ""
        self._submits = 0
        self._known_executors: set[int] = set()

    @property
    def home(self) -> Path:
        return Path(self.env["SPARK_HOME"])

    def _spark_class(self, *args: str) -> list[str]:
        return [str(self.home / "bin" / "spark-class"), *args]

    def start(self) -> SparkCluster:
        started = time.monotonic()
        logs = self.workdir / "logs"
        self.master = SparkDaemon(
            "spark master",
            self._spark_class(MASTER_CLASS, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"),
            logs / "master.log",
            self.env,
            self.workdir,
        )
        try:
            self.master.spawn()
            url = self.master.wait_for(r"Starting Spark master at (spark://\S+)", self.startup_timeout)
            self.master_url = url.group(1)
            self.master.wait_for(r"I have been elected leader", self.startup_timeout)
            for i in range(self.n_workers):
                work = self.workdir / f"worker-{i}"
                work.mkdir(parents=True, exist_ok=True)
                worker = SparkDaemon(
                    f"spark worker {i}",
                    self._spark_class(
                        WORKER_CLASS, self.master_url, "--host", "127.0.0.1", "--cores", str(self.cores),
                        "--memory", self.memory, "--webui-port", "0", "--work-dir", str(work),
                    ),
                    logs / f"worker-{i}.log",
                    self.env,
                    self.workdir,
                )
                self.workers.append(worker)
                worker.spawn()  # all workers start together; readiness is checked below
            left = self.startup_timeout - (time.monotonic() - started)
            for worker in self.workers:
                worker.wait_for(r"Successfully registered with master", max(left, 10.0))
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    # ------------------------------------------------------------------ jobs

    def submit_command(self, app: str | Path, app_args: Sequence[str] = (), conf: Mapping[str, str] | None = None,
                       submit_args: Sequence[str] = (), master: str | None = None) -> list[str]:
        conf_args: list[str] = []
        merged = {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            **(conf or {}),
        }
        for key, value in merged.items():
            conf_args += ["--conf", f"{key}={value}"]
        return [
            str(self.home / "bin" / "spark-submit"), "--master", master or self.master_url, "--deploy-mode", "client",
            *conf_args, *submit_args, str(app), *app_args,
        ]

    def start_submit(
        self,
        app: str | Path,
        app_args: Sequence[str] = (),
        *,
        conf: Mapping[str, str] | None = None,
        submit_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        master: str | None = None,
    ) -> Submission:
        """Start ``spark-submit --master <this cluster> --deploy-mode client ... app app_args``.

        The app's stdout goes to ``logs/submit-N.out``, the driver's log (stderr) to
        ``logs/submit-N.log``. ``PYSPARK_PYTHON`` defaults to this interpreter. ``master``
        replaces the cluster's (e.g. ``local[2]`` for a same-machine comparison).
        """
        self._submits += 1
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        out_path, log_path = logs / f"submit-{self._submits}.out", logs / f"submit-{self._submits}.log"
        full_env = dict(self.env)
        full_env.setdefault("PYSPARK_PYTHON", sys.executable)
        full_env.update(env or {})
        with open(out_path, "wb") as out, open(log_path, "wb") as log:
            proc = subprocess.Popen(
                self.submit_command(app, app_args, conf, submit_args, master),
                stdout=out,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=full_env,
                cwd=str(cwd or self.workdir),
                start_new_session=True,
            )
        return Submission(proc, out_path, log_path)

    def submit(
        self,
        app: str | Path,
        app_args: Sequence[str] = (),
        *,
        timeout: float = 300.0,
        conf: Mapping[str, str] | None = None,
        submit_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        master: str | None = None,
    ) -> SubmitResult:
        """Run a job to the end (see :meth:`start_submit`); the result is not checked."""
        job = self.start_submit(app, app_args, conf=conf, submit_args=submit_args, env=env, cwd=cwd, master=master)
        return job.wait(timeout)

    # ------------------------------------------------------------------ executors

    def executor_pids(self) -> list[int]:
        """Pids of the live executor JVMs (children of the worker JVMs)."""
        pids: list[int] = []
        for worker in self.workers:
            if worker.alive:
                pids += [pid for pid, cmd in _children(worker.pid) if EXECUTOR_CLASS in cmd]
        self._known_executors.update(pids)
        return sorted(pids)

    def wait_executors(self, count: int, timeout: float = 120.0) -> list[int]:
        deadline = time.monotonic() + timeout
        while True:
            pids = self.executor_pids()
            if len(pids) >= count or time.monotonic() > deadline:
                return pids
            time.sleep(0.2)

    def kill_executor(self, pid: int) -> None:
        """SIGKILL one executor JVM (by pid; its worker reaps it and launches a new one)."""
        if pid not in self._known_executors:
            raise ValueError(f"pid {pid} is not an executor of this cluster")
        os.kill(pid, signal.SIGKILL)

    # ------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        executors = self.executor_pids() if self.workers else []
        for worker in self.workers:
            worker.stop()
        if self.master is not None:
            self.master.stop()
        for pid in executors:  # a worker stops its executors; make sure, by pid
            if not _wait_gone(pid, 5.0):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class ConnectServer:
    """A Spark Connect server on ``cluster`` started with ``sbin/start-connect-server.sh``.

    ``python`` is the interpreter of the server's Python workers (``PYSPARK_PYTHON``): it
    needs the library, since the data source runs there. ``cores_max`` sets
    ``spark.cores.max`` (without it the server holds every core of the cluster).
    """

    def __init__(self, cluster: SparkCluster, workdir: str | Path, *, python: str = sys.executable,
                 cores_max: int = 2, conf: Mapping[str, str] | None = None, startup_timeout: float = 180.0) -> None:
        self.cluster = cluster
        self.workdir = Path(workdir).resolve()
        self.python = python
        self.cores_max = cores_max
        self.conf = dict(conf or {})
        self.startup_timeout = startup_timeout
        self.port = 0
        self.pid: int | None = None
        self.log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        conf = {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.cores.max": str(self.cores_max),
            "spark.ui.enabled": "false",
            **self.conf,
        }
        args = [str(self.cluster.home / "sbin" / "start-connect-server.sh"), "--master", self.cluster.master_url]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        return args

    def start(self) -> ConnectServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        env = dict(self.cluster.env)
        env.update({"SPARK_LOG_DIR": str(self.workdir), "SPARK_PID_DIR": str(self.workdir),
                    "PYSPARK_PYTHON": self.python, "SPARK_IDENT_STRING": f"amq{os.getpid()}"})
        started = time.monotonic()
        done = subprocess.run(self.command(), env=env, cwd=self.workdir, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"start-connect-server.sh failed ({done.returncode}): {done.stdout}{done.stderr}")
        pid_files = sorted(self.workdir.glob(f"*{CONNECT_CLASS}*.pid"))
        logs = sorted(self.workdir.glob(f"*{CONNECT_CLASS}*.out"))
        if not pid_files or not logs:
            raise RuntimeError(f"start-connect-server.sh left no pid file or log in {self.workdir}: {done.stdout}")
        self.pid = int(pid_files[0].read_text().strip())
        self.log_path = logs[0]
        regex = re.compile(r"Spark Connect server started")
        deadline = time.monotonic() + self.startup_timeout
        while not regex.search(read_log(self.log_path)):
            if not _alive(self.pid):
                raise RuntimeError(f"the Spark Connect server (pid {self.pid}) exited; log:\n"
                                   f"{read_log(self.log_path)[-4000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Spark Connect server did not start in {self.startup_timeout:.0f} s; "
                                   f"log:\n{read_log(self.log_path)[-4000:]}")
            time.sleep(0.2)
        self.startup_seconds = time.monotonic() - started
        return self

    def log_text(self) -> str:
        return read_log(self.log_path)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the server's JVM by the pid in its pid file; SIGKILL after ``timeout``."""
        if self.pid is None or not _alive(self.pid):
            return
        os.kill(self.pid, signal.SIGTERM)
        if not _wait_gone(self.pid, timeout):
            os.kill(self.pid, signal.SIGKILL)
            _wait_gone(self.pid, 10.0)

    def __enter__(self) -> ConnectServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
