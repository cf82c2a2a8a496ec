"""Run a real RabbitMQ (Debian's ``rabbitmq-server``) with its STOMP plugin as a child process.

Theory of operation
-------------------
Debian's package installs the broker under ``/usr/lib/rabbitmq`` and a system
service we do not use (no systemd here, and its listeners bind every interface).
:class:`RabbitMQNode` gives each node a private directory holding a generated
``rabbitmq.conf`` (AMQP, STOMP and Erlang-distribution listeners on ``127.0.0.1``,
ports picked by :func:`amqtransport.processes.ports.free_port`), its own
``enabled_plugins`` file (``rabbitmq_stomp``), database (``mnesia``), logs and Erlang
cookie (``HOME`` points there), all passed through ``RABBITMQ_*`` variables; nothing
under ``/etc`` or ``/var`` is read or written, and no root is needed.

Two processes per node, both our children, each stopped by its pid:

- ``epmd`` (the Erlang port mapper) in the foreground on its own loopback port
  (``ERL_EPMD_PORT``), started first so the broker finds it instead of forking a
  daemon that would outlive the tests;
- the broker: ``rabbitmq-server`` with ``RABBITMQ_ALLOW_INPUT`` set ``exec``s ``erl``
  directly (no wrapper shell), so the child's pid is the Erlang VM's: SIGKILL is a
  real crash, SIGTERM a clean stop (the VM runs ``init:stop()``).

Both run in their own session and, when started from the main thread on Linux,
under ``setpriv --pdeathsig KILL`` (it ``exec``s, the pid stays): if the test process
dies hard they die too. An ``atexit`` hook kills whatever is left.

"Serving" means a STOMP CONNECT (virtual host ``/``, guest/guest, allowed from
localhost only) is answered with CONNECTED. A first boot takes 5-15 s on these
machines; a restart on the same directory keeps durable queues and persistent messages.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from types import TracebackType

from amqtransport.errors import AmqTransportError
from amqtransport.processes.ports import free_port
from amqtransport.processes.spawn import KillAtExit, stomp_handshake

__all__ = ["RABBITMQ_SERVER_ENV", "RabbitMQError", "RabbitMQNode", "missing_reason", "rabbitmq_server"]

log = logging.getLogger(__name__)

RABBITMQ_SERVER_ENV = "AMQ_RABBITMQ_SERVER"
"""Environment variable naming the ``rabbitmq-server`` script (default Debian's)."""

DEFAULT_SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")

_BIND_FAILURE = re.compile(r"eaddrinuse|address already in use|Failed to start Ranch listener", re.I)


class RabbitMQError(AmqTransportError, RuntimeError):
    """A RabbitMQ node did not start, serve or stop as expected (the message has the log tail)."""


def rabbitmq_server() -> Path | None:
    """The ``rabbitmq-server`` script to run, or None when RabbitMQ is not installed."""
    env = os.environ.get(RABBITMQ_SERVER_ENV)
    path = Path(env) if env else DEFAULT_SERVER
    return path if path.is_file() and os.access(path, os.X_OK) else None


def _epmd() -> str | None:
    return shutil.which("epmd") or next(
        (str(p) for p in sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd")) if p.is_file()), None)


def missing_reason() -> str | None:
    """Why RabbitMQ nodes cannot run here (for a pytest skip), or None when they can."""
    server = rabbitmq_server()
    if server is None:
        where = os.environ.get(RABBITMQ_SERVER_ENV) or str(DEFAULT_SERVER)
        return (f"RabbitMQ is not installed ({where} missing); run scripts/setup.sh as root or "
                "`apt-get install -y rabbitmq-server`")
    plugins = list(Path(server).resolve().parent.parent.glob("plugins/rabbitmq_stomp-*"))
    if not plugins:
        return f"RabbitMQ's STOMP plugin is missing (no plugins/rabbitmq_stomp-* next to {server})"
    if _epmd() is None:
        return "no epmd (Erlang port mapper) on PATH; RabbitMQ needs Erlang"
    return None


# ---------------------------------------------------------------- process bookkeeping

_live: KillAtExit[RabbitMQNode] = KillAtExit(lambda node: node.kill(epmd=True))


def _spawn(cmd: list[str], *, env: dict[str, str], cwd: Path, log_path: Path) -> subprocess.Popen[bytes]:
    if (threading.current_thread() is threading.main_thread() and os.environ.get("AMQ_RABBITMQ_NO_PDEATHSIG") != "1"
            and (setpriv := shutil.which("setpriv")) is not None):
        cmd = [setpriv, "--pdeathsig", "KILL", "--", *cmd]
    with open(log_path, "ab") as out:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)


def _reap(proc: subprocess.Popen[bytes] | None, sig: int, timeout: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


class RabbitMQNode:
    """One RabbitMQ node with STOMP on 127.0.0.1 (see the module docstring).

    Restartable: after :meth:`kill` (SIGKILL of the VM) or :meth:`stop`, :meth:`start`
    runs it again on the same directory and ports. Usable as a context manager.
    """

    def __init__(self, workdir: str | os.PathLike[str], name: str = "amqtest", *, extra_config: str = "") -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
            raise ValueError(f"RabbitMQNode name {name!r}: use letters, digits, '_', '-'")
        self.name = name
        self.dir = Path(workdir).resolve() / name
        self.host = "127.0.0.1"
        self.stomp_port = free_port()
        self.amqp_port = free_port()
        self.dist_port = free_port()
        self.epmd_port = free_port()
        self.extra_config = extra_config
        self.log_path = self.dir / "rabbitmq.out"
        self.start_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._epmd: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    # -- addresses
    @property
    def uri(self) -> str:
        """``tcp://127.0.0.1:PORT`` of the STOMP listener."""
        return f"tcp://{self.host}:{self.stomp_port}"

    @property
    def nodename(self) -> str:
        return f"{self.name}@localhost"

    @property
    def pid(self) -> int | None:
        """The Erlang VM's pid (what ``kill -9`` of RabbitMQ means)."""
        return None if self._proc is None else self._proc.pid

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- configuration
    def write_config(self) -> None:
        for sub in ("mnesia", "log", "plugins-expand"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "rabbitmq.conf").write_text(
            "# generated by amqtransport.testing.rabbitmq: loopback only\n"
            f"listeners.tcp.1 = {self.host}:{self.amqp_port}\n"
            f"stomp.listeners.tcp.1 = {self.host}:{self.stomp_port}\n"
            f"distribution.listener.interface = {self.host}\n"
            f"distribution.listener.port_range.min = {self.dist_port}\n"
            f"distribution.listener.port_range.max = {self.dist_port}\n"
            "log.console = false\n"
            "log.file.level = info\n"
            f"{self.extra_config}\n", encoding="utf-8")
        (self.dir / "enabled_plugins").write_text("[rabbitmq_stomp].\n", encoding="utf-8")
        (self.dir / "rabbitmq-env.conf").write_text("# empty: every setting comes from the environment\n")

    def env(self) -> dict[str, str]:
        """The environment of the broker and of ``rabbitmqctl`` for this node."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update({
            "HOME": str(self.dir),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(self.dir / "plugins-expand"),
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_ALLOW_INPUT": "1",  # exec erl directly: our child is the VM
            "ERL_EPMD_ADDRESS": self.host,
            "ERL_EPMD_PORT": str(self.epmd_port),
        })
        return env

    # -- lifecycle
    def start(self, timeout: float = 90.0) -> RabbitMQNode:
        """Start epmd (if needed) and the broker; block until STOMP serves."""
        if self.alive:
            raise RabbitMQError(f"{self.name}: already running (pid {self.pid})")
        server = rabbitmq_server()
        epmd = _epmd()
        if server is None or epmd is None:
            raise RabbitMQError(missing_reason() or "RabbitMQ unavailable")
        self.write_config()
        env = self.env()
        with open(self.log_path, "ab") as out:
            self._log_offset = out.tell() + 1
            out.write(f"\n=== amqtransport: starting {self.nodename} on stomp port {self.stomp_port} ===\n".encode())
        if self._epmd is None or self._epmd.poll() is not None:
            self._epmd = _spawn([epmd, "-port", str(self.epmd_port), "-address", self.host], env=env,
                                cwd=self.dir, log_path=self.dir / "epmd.out")
        spawned = time.monotonic()
        self._proc = _spawn([str(server), "-noinput"], env=env, cwd=self.dir, log_path=self.log_path)
        _live.add(self)
        log.info("%s: started pid %d (stomp %s)", self.name, self._proc.pid, self.uri)
        try:
            self.wait_until_serving(timeout)
        except RabbitMQError:
            self.kill(epmd=True)
            raise
        self.start_seconds = time.monotonic() - spawned
        return self

    def is_serving(self, timeout: float = 2.0) -> bool:
        return self.alive and self._handshake(timeout)

    def _handshake(self, timeout: float) -> bool:
        return stomp_handshake(self.host, self.stomp_port, timeout, vhost="/", login="guest", passcode="guest")

    def wait_until_serving(self, timeout: float = 90.0, poll: float = 0.1) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if not self.alive:
                code = None if self._proc is None else self._proc.poll()
                raise RabbitMQError(f"{self.name}: the VM exited (code {code}) before serving on {self.uri}"
                                    f"\n--- log tail ---\n{self.log_tail()}")
            if self._handshake(1.0):
                return
            if time.monotonic() >= deadline:
                raise RabbitMQError(f"{self.name}: not serving on {self.uri} after {timeout:.0f}s"
                                    f"\n--- log tail ---\n{self.log_tail()}")
            time.sleep(poll)

    def kill(self, *, epmd: bool = False) -> None:
        """SIGKILL the Erlang VM (a crash: ``kill -9``); with ``epmd`` its port mapper too."""
        _reap(self._proc, signal.SIGKILL, 30)
        if epmd:
            _reap(self._epmd, signal.SIGKILL, 30)

    def stop(self, timeout: float = 30.0) -> None:
        """Clean stop (SIGTERM: the VM runs ``init:stop()``), SIGKILL past ``timeout``; then epmd."""
        _reap(self._proc, signal.SIGTERM, timeout)
        _reap(self._epmd, signal.SIGTERM, 5)

    def restart(self, timeout: float = 90.0) -> RabbitMQNode:
        self.kill()
        return self.start(timeout)

    def log_tail(self, lines: int = 40) -> str:
        """The end of this node's output and of its main log file."""
        parts = []
        for path in (self.log_path, self.dir / "log" / f"{self.nodename}.log"):
            if path.exists():
                text = path.read_text(encoding="utf-8", errors="replace").splitlines()
                parts.append(f"[{path.name}]\n" + "\n".join(text[-lines:]))
        return "\n".join(parts)

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl -n NODE ARGS`` for this node; its stdout (raises on failure)."""
        server = rabbitmq_server()
        assert server is not None
        ctl = server.parent / "rabbitmqctl"
        res = subprocess.run([str(ctl), "-q", "-n", self.nodename, *args], env=self.env(), cwd=self.dir,
                             capture_output=True, text=True, timeout=timeout, check=False)
        if res.returncode != 0:
            raise RabbitMQError(f"rabbitmqctl {' '.join(args)}: exit {res.returncode}: {res.stderr.strip()}")
        return res.stdout

    def persist_definitions(self) -> None:
        """Make the node write queue definitions made so far to disk (``mnesia:dump_log()``).

        Measured here: a durable queue declared seconds before a ``kill -9`` can be
        missing after the restart (the node recovers one queue fewer), and with it every
        message it held, receipted or not; 1 round in 8. A test that means to check
        what a *client* keeps across a crash declares its queue first and calls this.
        """
        self.ctl("eval", "mnesia:dump_log().")

    def queues(self) -> dict[str, int]:
        """Queue name -> ready message count (``rabbitmqctl list_queues``)."""
        out: dict[str, int] = {}
        for line in self.ctl("list_queues", "name", "messages_ready").splitlines():
            parts = line.rsplit(None, 1)
            if len(parts) == 2 and parts[1].isdigit():
                out[parts[0]] = int(parts[1])
        return out

    def __enter__(self) -> RabbitMQNode:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
