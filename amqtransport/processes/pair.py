"""BrokerPair: a master/slave pair of our broker as two real child processes.

Each node is ``amq broker run --ha MODE`` on fixed ports (clients list both ports in
their ``failover:`` URI, so a slave's port must be known before it binds). Node ``a``
is the configured master; node ``b`` the configured slave (replicated: with
``--master-connector`` pointing at ``a``'s HA port; shared store: on the same data
directory). :meth:`BrokerPair.start` starts ``a``, waits for it to be master, then
starts ``b`` (a fresh pair in tests); ``start(together=True)`` -- what ``amq broker
pair`` does -- starts both at once and lets the nodes' own HA decision pick the master
from their data (the newer epoch wins, the other joins as slave), so a pair restarted
on the data of an earlier run comes up whatever ended that run: a master kill (the
slave is master at a newer epoch), a clean stop, both nodes killed. That needs each
node's HA port to be the one its peer knows from the earlier run (``ha-state.json``):
:func:`load_ports` / :func:`save_ports` keep them in ``<data_dir>/pair.json``. Roles
then move with failures: :attr:`BrokerPair.master` asks the nodes.

The child's stdout carries one line per role change (``role master epoch 3``,
``listening on stomp://...``); a reader thread keeps them in :attr:`HaNodeProcess.lines`
(and hands each to :attr:`HaNodeProcess.on_line`). Logs go to
``<data_dir>/logs/<name>-<n>.log``, ``n`` one more than the last log there (earlier
runs' logs are kept). Everything is stopped by pid on exit -- a node that was restarted
by hand (with the command line ``amq broker pair`` printed) too: it answers on the
node's HA port with the node's name and its pid (:meth:`HaNodeProcess.foreign_pid`). A
replicated pair shares a cluster secret: ``cluster_password=``/``cluster_password_file=``,
else one generated into ``<data_dir>/cluster.secret`` (mode 0600) and kept there, so a
node restarted by hand with the command line in its log still matches its peer.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from amqtransport.broker.ha.auth import generate_secret
from amqtransport.broker.ha.wire import ha_request_sync
from amqtransport.broker.store.files import replace_file, write_all

from .ports import free_port
from .spawn import kill_and_reap, private_dir, read_log, spawn_logged, terminate_and_reap

__all__ = ["BrokerPair", "HaNodeProcess", "SECRET_FILE", "PORTS_FILE", "load_ports", "save_ports", "pid_alive"]

#: the cluster secret of a replicated pair, in its data directory (generated once per pair)
SECRET_FILE = "cluster.secret"
#: the ports of ``amq broker pair``'s nodes, in its data directory (kept from run to run)
PORTS_FILE = "pair.json"


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def stop_pid(pid: int, timeout: float = 20.0) -> bool:
    """SIGTERM process ``pid`` (not our child: polled, not waited for), SIGKILL after
    ``timeout``; True once it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
            return not pid_alive(pid)
        time.sleep(0.05)
    return True


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when ``port`` cannot be bound on ``host`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def load_ports(data_dir: str | Path) -> dict[str, dict[str, int]]:
    """``{"a": {"port": P, "ha_port": H}, "b": ...}`` from ``<data_dir>/pair.json``; {}
    when there is none (or it cannot be read: the pair then picks new HA ports)."""
    path = Path(data_dir) / PORTS_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return {name: {"port": int(raw["nodes"][name]["port"]), "ha_port": int(raw["nodes"][name]["ha_port"])}
                for name in ("a", "b")}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def save_ports(pair: BrokerPair) -> None:
    """Write the nodes' ports to ``<data_dir>/pair.json`` (read back by :func:`load_ports`)."""
    nodes = {n.name: {"port": n.port, "ha_port": n.ha_port} for n in pair.nodes}
    data = (json.dumps({"mode": pair.mode, "nodes": nodes}, indent=1, sort_keys=True) + "\n").encode("utf-8")
    # no fsync: a lost pair.json only makes the next run pick new HA ports (load_ports)
    replace_file(pair.data_dir, PORTS_FILE, lambda fd: write_all(fd, data), fsync=False, mode=0o666)


class HaNodeProcess:
    """One HA node process (``amq broker run --ha ...``)."""

    def __init__(
        self,
        name: str,
        data_dir: Path,
        port: int,
        ha_port: int,
        args: Sequence[str],
        log_dir: Path,
        host: str = "127.0.0.1",
        relay_port: int | None = None,
    ) -> None:
        self.name = name
        self.data_dir = data_dir
        self.port = port
        self.ha_port = ha_port
        #: --relay-port: where this node relays clients to the master while it is not master
        self.relay_port = relay_port
        self.args = list(args)
        self.host = host
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.lines: list[str] = []
        self._cond = threading.Condition()
        # logs of earlier runs in log_dir are kept: this run's first log is the next number
        numbers = [int(m.group(1)) for p in log_dir.glob(f"{name}-*.log")
                   if (m := re.fullmatch(rf"{re.escape(name)}-(\d+)\.log", p.name))]
        self._starts = max(numbers, default=0)
        self.log_path: Path | None = None
        self._reader: threading.Thread | None = None
        #: called with (node, line) for every stdout line, on the reader thread
        self.on_line: Callable[[HaNodeProcess, str], None] | None = None
        #: a command prefix the process starts under (e.g. ``ip netns exec NS``: the chaos
        #: nemesis runs nodes in network namespaces); it must exec, keeping the pid
        self.wrap: list[str] = []

    @property
    def uri(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    @property
    def relay_uri(self) -> str:
        """``tcp://HOST:RELAY_PORT`` (the node runs with ``--relay-port``)."""
        assert self.relay_port is not None, f"node {self.name} has no relay port"
        return f"tcp://{self.host}:{self.relay_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"node {self.name} not started"
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "amqtransport", "broker", "run",
            "--port", str(self.port), "--ha-port", str(self.ha_port),
            "--host", self.host, "--name", self.name, "--data-dir", str(self.data_dir),
            *(["--relay-port", str(self.relay_port)] if self.relay_port is not None else []),
            *self.args,
        ]

    def start(self, timeout: float = 30.0) -> HaNodeProcess:
        if self.alive:
            return self
        self.spawn()
        try:
            self.wait_line("ha node ", timeout)
        except BaseException:
            self.kill()
            raise
        return self

    @property
    def next_log_path(self) -> Path:
        """Where the next start logs (earlier logs are kept)."""
        return self.log_dir / f"{self.name}-{self._starts + 1}.log"

    def spawn(self) -> HaNodeProcess:
        """Start the process (not waiting for it: :meth:`wait_line`)."""
        if self.alive:
            return self
        self._starts += 1
        private_dir(self.log_dir)
        self.log_path = self.log_dir / f"{self.name}-{self._starts}.log"
        with self._cond:
            self.lines = []
        # new session: a terminal's Ctrl-C reaches `amq broker pair`, which stops us in order
        self.proc = spawn_logged([*self.wrap, *self.command()], self.log_path, new_session=True)
        self._reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True,
                                        name=f"ha-node-reader:{self.name}")
        self._reader.start()
        return self

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").strip()
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
            if self.on_line is not None:
                with contextlib.suppress(Exception):
                    self.on_line(self, line)
        with self._cond:
            self._cond.notify_all()

    def wait_line(self, prefix: str, timeout: float, start: int = 0) -> str:
        """Wait for a stdout line starting with ``prefix`` (from line index ``start``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines[start:]:
                    if line.startswith(prefix):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc is not None and self.proc.poll() is not None and not left):
                    break
                if self.proc is not None and self.proc.poll() is not None:
                    # process gone: give the reader a moment to drain, then fail
                    self._cond.wait(0.2)
                    if not any(x.startswith(prefix) for x in self.lines[start:]):
                        break
                    continue
                self._cond.wait(min(left, 0.5))
        raise TimeoutError(
            f"node {self.name}: no {prefix!r} line within {timeout} s (alive={self.alive}); "
            f"lines={self.lines[-10:]}; log tail:\n{self.log_text()[-3000:]}"
        )

    def status(self, timeout: float = 2.0) -> dict[str, str]:
        """The node's HA status headers (``amq-ha-role`` ...); {} when unreachable."""
        try:
            frame = ha_request_sync(self.host, self.ha_port, timeout)
        except (OSError, TimeoutError):
            return {}
        return dict(frame.headers) if frame.command == "CONNECTED" else {}

    @property
    def role(self) -> str:
        return self.status().get("amq-ha-role", "down") if self.alive else "down"

    def foreign_pid(self, timeout: float = 1.0) -> int | None:
        """The pid of a process that is this node but not our child (restarted by hand
        with :meth:`command`): it answers on this node's HA port with this node's name.
        None while our own child runs, or when nothing (or another node) answers."""
        if self.alive:
            return None
        st = self.status(timeout)
        pid = st.get("amq-ha-pid", "")
        if st.get("amq-ha-name") != self.name or not pid.isdigit() or int(pid) == os.getpid():
            return None
        return int(pid)

    def log_text(self) -> str:
        return read_log(self.log_path)

    def all_logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob(f"{self.name}-*.log")))

    def kill(self) -> None:
        """SIGKILL and wait (a crash)."""
        if self.proc is None:
            return
        kill_and_reap(self.proc)
        self._close()

    def terminate(self, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        code = terminate_and_reap(self.proc, timeout, kill_wait=10)
        self._close()
        return code

    def _close(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        if self._reader is not None:
            self._reader.join(5)
            self._reader = None


class BrokerPair:
    """Two HA nodes (``mode`` = ``replicated`` or ``shared-store``); a context manager."""

    def __init__(
        self,
        mode: str = "replicated",
        data_dir: str | Path | None = None,
        *,
        port: int = 0,
        slave_port: int = 0,
        users: Mapping[str, str] | None = None,
        master_user: str | None = None,
        master_password: str | None = None,
        slave_master_user: str | None = None,
        slave_master_password: str | None = None,
        master_connector: str | None = None,
        takeover_check: str | None = None,
        witness: str | None = None,
        relay: bool = False,
        relay_ports: Sequence[int] = (),
        lock_interval: float | None = None,
        link_timeout: float | None = None,
        extra_args: Sequence[str] = (),
        master_args: Sequence[str] = (),
        slave_args: Sequence[str] = (),
        fsync: bool = True,
        cluster_password: str | None = None,
        cluster_password_file: str | Path | None = None,
        ha_ports: Sequence[int] = (),
    ) -> None:
        if mode not in ("replicated", "shared-store"):
            raise ValueError(f"mode must be 'replicated' or 'shared-store', got {mode!r}")
        self.mode = mode
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"amq-pair-{mode}-")
            data_dir = self._tmp.name
        self.data_dir = private_dir(data_dir)
        common: list[str] = ["--ha", mode, *extra_args]
        self.cluster_password_file: Path | None = None
        if mode == "replicated" or witness:  # the witness knows a pair by its secret
            self.cluster_password_file = self._secret_file(cluster_password, cluster_password_file)
            common += ["--cluster-password-file", str(self.cluster_password_file)]
        if users:
            users_file = self._private_file("users.txt", "\n".join(f"{u}:{p}" for u, p in users.items()))
            common += ["--users", str(users_file)]
        if lock_interval is not None:
            common += ["--lock-interval", str(lock_interval)]
        if link_timeout is not None:
            common += ["--link-timeout", str(link_timeout)]
        if takeover_check:
            common += ["--takeover-check", takeover_check]
        if witness:
            common += ["--witness", witness]
        if not fsync:
            cfg = self.data_dir / "broker.toml"
            cfg.write_text("fsync = false\n")
            common += ["--config", str(cfg)]
        ports = [port or free_port(), slave_port or free_port()]
        while ports[1] == ports[0]:
            ports[1] = free_port()
        if ha_ports:
            if len(ha_ports) != 2 or len({*ports, *ha_ports}) < 4:
                raise ValueError(f"ha_ports must be two ports distinct from the client ports {ports}, got {ha_ports}")
            ha_ports = list(ha_ports)
        else:
            ha_ports = [free_port(), free_port()]
            while len({*ports, *ha_ports}) < 4:
                ha_ports = [free_port(), free_port()]
        relays: list[int | None] = [None, None]
        if relay_ports:
            if len(relay_ports) != 2 or len({*ports, *ha_ports, *relay_ports}) < 6:
                raise ValueError(f"relay_ports must be two ports distinct from the client and HA ports "
                                 f"{[*ports, *ha_ports]}, got {relay_ports}")
            relays = list(relay_ports)
        elif relay:
            picked = [free_port(), free_port()]
            while len({*ports, *ha_ports, *picked}) < 6:
                picked = [free_port(), free_port()]
            relays = list(picked)
        if mode == "shared-store":
            dirs = [self.data_dir / "store", self.data_dir / "store"]
        else:
            dirs = [self.data_dir / "a", self.data_dir / "b"]
        # the replication passcode goes to the nodes in a file (0600), never on their command line
        creds_a: list[str] = []
        if master_user is not None:
            creds_a = ["--master-user", master_user, "--master-password-file",
                       str(self._private_file("master.password", master_password or ""))]
        creds_b = creds_a
        if slave_master_user is not None:
            creds_b = ["--master-user", slave_master_user, "--master-password-file",
                       str(self._private_file("master-b.password", slave_master_password or ""))]
        args_a = [*common, *creds_a, *master_args]
        args_b = [*common, *creds_b, *slave_args]
        if mode == "replicated":
            args_b += ["--master-connector", master_connector or f"tcp://127.0.0.1:{ha_ports[0]}"]
        logs = self.data_dir / "logs"
        self.a = HaNodeProcess("a", dirs[0], ports[0], ha_ports[0], args_a, logs, relay_port=relays[0])
        self.b = HaNodeProcess("b", dirs[1], ports[1], ha_ports[1], args_b, logs, relay_port=relays[1])
        self.nodes = (self.a, self.b)

    def _private_file(self, name: str, content: str) -> Path:
        """``<data_dir>/name`` holding ``content`` (one line), mode 0600."""
        target = (self.data_dir / name).resolve()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(content + "\n")
        return target

    def _secret_file(self, password: str | None, path: str | Path | None) -> Path:
        """The pair's cluster secret file: ``path`` as given, else ``<data_dir>/cluster.secret``
        holding ``password`` (or the secret already there, or a new one), mode 0600."""
        if path is not None:
            return Path(path).resolve()
        target = (self.data_dir / SECRET_FILE).resolve()
        if password is None and target.exists():
            return target
        secret = password if password is not None else generate_secret()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(secret + "\n")
        return target

    # ------------------------------------------------------------------ properties
    @property
    def uri(self) -> str:
        """The clients' failover URI: both client ports, then (nodes with ``--relay-port``)
        both relay ports, as a last resort (docs/ha.md, "Relaying clients through the slave")."""
        relays = [n.relay_uri for n in self.nodes if n.relay_port is not None]
        return f"failover:({','.join([self.a.uri, self.b.uri, *relays])})?randomize=false"

    @property
    def master(self) -> HaNodeProcess | None:
        for node in self.nodes:
            if node.alive:
                st = node.status()
                if st.get("amq-ha-role") == "master" and st.get("amq-ha-listening") == "true":
                    return node
        return None

    @property
    def slave(self) -> HaNodeProcess | None:
        for node in self.nodes:
            if node.alive and node.status().get("amq-ha-role") in ("slave", "waiting"):
                return node
        return None

    def other(self, node: HaNodeProcess) -> HaNodeProcess:
        return self.b if node is self.a else self.a

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 60.0, *, together: bool = False) -> BrokerPair:
        """Start the pair; return once a master serves and the slave is in sync
        (replicated) or waits on the lock (shared store). ``together`` (replicated):
        start both nodes at once and let their HA decision pick the master from their
        data -- the way to start a pair on the data of an earlier run, whose newer
        store may be ``b``'s (``a`` would wait for it forever if ``b`` started only
        once ``a`` were master)."""
        if together and self.mode == "replicated":
            for node in self.nodes:
                node.spawn()
            for node in self.nodes:
                try:
                    node.wait_line("ha node ", timeout)
                except BaseException:
                    node.kill()
                    raise
            self.wait_master(timeout, fail_on_exit=True)
            self.wait_in_sync(timeout)
            return self
        self.a.start(timeout)
        self.wait_master(timeout)
        self.b.start(timeout)
        if self.mode == "replicated":
            self.wait_in_sync(timeout)
        else:
            self.b.wait_line("role slave", timeout)
        return self

    def wait_master(self, timeout: float = 30.0, exclude: HaNodeProcess | None = None, *,
                    fail_on_exit: bool = False) -> HaNodeProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes:
                if fail_on_exit and node.proc is not None and node.proc.poll() is not None:
                    raise RuntimeError(f"node {node.name} exited with code {node.proc.returncode} while the pair "
                                       f"was starting; its log {node.log_path}:\n{node.log_text()[-2000:]}")
                if node is exclude or not node.alive:
                    continue
                st = node.status(timeout=1.0)
                if st.get("amq-ha-role") == "master" and st.get("amq-ha-listening") == "true":
                    return node
            time.sleep(0.02)
        raise TimeoutError(f"no master within {timeout} s; " + self.describe())

    def wait_in_sync(self, timeout: float = 30.0) -> HaNodeProcess:
        """Wait until a slave is attached and in sync (replicated mode); returns it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.alive:
                    st = node.status(timeout=1.0)
                    if st.get("amq-ha-role") == "slave" and st.get("amq-ha-peer-state") == "in-sync":
                        return node
            time.sleep(0.05)
        raise TimeoutError(f"no slave in sync within {timeout} s; " + self.describe())

    def kill_master(self, timeout: float = 30.0) -> HaNodeProcess:
        """SIGKILL the current master; returns the killed node."""
        node = self.wait_master(timeout)
        node.kill()
        return node

    def restart(self, node: HaNodeProcess, timeout: float = 30.0) -> HaNodeProcess:
        if node.alive:
            node.terminate()
        return node.start(timeout)

    def describe(self) -> str:
        parts = []
        for node in self.nodes:
            st = node.status(timeout=0.5) if node.alive else {}
            parts.append(
                f"{node.name}: pid={node.proc.pid if node.proc else None} alive={node.alive} "
                f"role={st.get('amq-ha-role', 'down')} epoch={st.get('amq-ha-epoch')} lines={node.lines[-3:]}"
            )
        return "; ".join(parts)

    def stop(self) -> list[tuple[str, int, bool]]:
        """Stop both nodes by pid, the slave first (so the master does not see a failure
        and nobody takes over): our children, and a node restarted by hand
        (:meth:`HaNodeProcess.foreign_pid`). Returns ``(name, pid, stopped)`` for each
        process it found running."""
        running: list[tuple[HaNodeProcess, int, bool]] = []  # (node, pid, ours)
        for node in self.nodes:
            if node.alive:
                running.append((node, node.pid, True))
            elif (pid := node.foreign_pid(0.5)) is not None:
                running.append((node, pid, False))
        running.sort(key=lambda t: 1 if t[0].status(0.5).get("amq-ha-role") == "master" else 0)
        done: list[tuple[str, int, bool]] = []
        for node, pid, ours in running:
            if ours:
                try:
                    node.terminate(timeout=15)
                except Exception:  # noqa: BLE001 - keep stopping the others
                    node.kill()
                done.append((node.name, pid, not node.alive))
            else:
                done.append((node.name, pid, stop_pid(pid, 15)))
        for node in self.nodes:  # pipes and reader threads of children that had exited
            if not node.alive:
                node.terminate()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        return done

    def __enter__(self) -> BrokerPair:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
