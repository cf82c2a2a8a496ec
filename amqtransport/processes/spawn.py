"""Child-process plumbing shared by the broker harnesses (BrokerProcess, HaNodeProcess,
ActiveMQNode, RabbitMQNode).

Spawn ``command`` with stdout on a pipe (the harness reads its ``listening on`` /
role lines) and stderr into a log file; stop it by pid with SIGKILL (a crash) or
SIGTERM then SIGKILL (a clean stop), always reaping it so no zombie is left.
:class:`KillAtExit` kills what a harness left running when the interpreter exits;
:func:`stomp_handshake` is the readiness probe (a CONNECT answered by CONNECTED).
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Generic, TypeVar

from amqtransport.errors import AmqTransportError
from amqtransport.stomp import Frame, serialize
from amqtransport.stomp.session import ClientSession

__all__ = ["KillAtExit", "kill_and_reap", "private_dir", "read_log", "spawn_logged", "stomp_handshake",
           "terminate_and_reap"]

T = TypeVar("T")


class KillAtExit(Generic[T]):
    """The live nodes of one harness (weakly held); ``kill(node)`` runs for each one
    still registered when the interpreter exits (best effort)."""

    def __init__(self, kill: Callable[[T], object]) -> None:
        self._kill = kill
        self._live: weakref.WeakSet[T] = weakref.WeakSet()
        self._lock = threading.Lock()
        atexit.register(self.kill_all)

    def add(self, node: T) -> None:
        with self._lock:
            self._live.add(node)

    def discard(self, node: T) -> None:
        with self._lock:
            self._live.discard(node)

    def kill_all(self) -> None:
        with self._lock:
            nodes = list(self._live)
        for node in nodes:
            try:
                self._kill(node)
            except Exception:  # pragma: no cover - best effort at interpreter exit
                pass


def stomp_handshake(host: str, port: int, timeout: float = 2.0, *, vhost: str = "localhost",
                    login: str | None = None, passcode: str | None = None) -> bool:
    """True when a STOMP 1.2 CONNECT on host:port is answered by CONNECTED (the
    client session of :mod:`amqtransport.stomp.session`)."""
    session = ClientSession(host=vhost, login=login, passcode=passcode, accept_version="1.2")
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(session.connect_bytes())
            while session.feed(s.recv(4096)) is None:
                pass
            try:
                s.sendall(serialize(Frame.make("DISCONNECT"), "1.2"))
            except OSError:
                pass
            return True
    except (OSError, AmqTransportError):
        return False


def spawn_logged(
    command: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    *,
    new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``command``: stdout piped, stderr to ``log_path``, stdin closed, unbuffered Python."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    # logs hold queue names, users, addresses: readable by this user only
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "wb") as log_file:
        return subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE,
            stderr=log_file,
            stdin=subprocess.DEVNULL,
            env=full_env,
            start_new_session=new_session,
        )


def private_dir(path: str | Path) -> Path:
    """Create directory ``path`` (and its parents) readable by this user only (0700), or
    make an existing one of ours so; the files a process then creates in it stay its own
    (brokers run with umask 077)."""
    target = Path(path)
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = target.stat()
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        os.chmod(target, 0o700)
    return target


def read_log(log_path: Path | None) -> str:
    """The log file's text; "" when there is none yet."""
    if log_path is None or not log_path.exists():
        return ""
    return log_path.read_text(encoding="utf-8", errors="replace")


def kill_and_reap(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL (no flush, no cleanup: a crash) if still running, then wait."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(30)


def terminate_and_reap(proc: subprocess.Popen[bytes], timeout: float, kill_wait: float) -> int | None:
    """SIGTERM if still running; SIGKILL after ``timeout`` (then wait ``kill_wait``). The exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(kill_wait)
    return proc.returncode
