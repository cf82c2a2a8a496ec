"""WitnessProcess: ``amq broker witness`` (the arbiter of replicated pairs) as a child process.

The port is fixed when the object is made (a free one unless given), so the nodes can
be given ``--witness HOST:PORT`` before the witness starts and a restart (the same
data directory: the witness's durable state) answers on the same address. The child's
log goes to ``<data_dir>/logs/witness-<n>.log``. Stopped by pid on ``__exit__``.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from .ports import free_port
from .spawn import kill_and_reap, private_dir, read_log, spawn_logged, terminate_and_reap

__all__ = ["WitnessProcess"]

READY_LINE = "witness listening on tcp://"


class WitnessProcess:
    """One ``amq broker witness`` on ``host:port`` (port 0: a free one, fixed now)."""

    def __init__(self, data_dir: str | Path | None = None, port: int = 0, *, host: str = "127.0.0.1",
                 startup_timeout: float = 30.0) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="amq-witness-")
            data_dir = self._tmp.name
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port or free_port(host)
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self._starts = 0

    @property
    def address(self) -> str:
        """What the nodes are given: ``--witness HOST:PORT``."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "witness not started"
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "amqtransport", "broker", "witness", "--port", str(self.port),
                "--host", self.host, "--data-dir", str(self.data_dir)]

    def start(self) -> WitnessProcess:
        """Start it and wait for its ``witness listening on`` line."""
        if self.alive:
            return self
        self._starts += 1
        log_dir = private_dir(self.data_dir / "logs")
        self.log_path = log_dir / f"witness-{self._starts}.log"
        self.proc = spawn_logged(self.command(), self.log_path)
        try:
            self._wait_ready()
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + self.startup_timeout
        buf = b""
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while time.monotonic() < deadline:
                if sel.select(timeout=0.1):
                    chunk = os.read(self.proc.stdout.fileno(), 4096)
                    if not chunk:
                        break
                    buf += chunk
                    if any(line.strip().startswith(READY_LINE.encode()) for line in buf.split(b"\n")):
                        return
                elif self.proc.poll() is not None:
                    break
        finally:
            sel.close()
        raise RuntimeError(f"witness did not report {READY_LINE!r} within {self.startup_timeout} s "
                           f"(exit code {self.proc.poll()}); stdout={buf!r}; log:\n{self.log_text()[-3000:]}")

    def log_text(self) -> str:
        return read_log(self.log_path)

    def kill(self) -> None:
        """SIGKILL (a crash) and wait."""
        if self.proc is not None:
            kill_and_reap(self.proc)
            self._close()

    def terminate(self, timeout: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        code = terminate_and_reap(self.proc, timeout, kill_wait=10)
        self._close()
        return code

    stop = terminate

    def restart(self, *, hard: bool = False) -> WitnessProcess:
        """Stop it (SIGKILL when ``hard``) and start it again on the same port and data."""
        if hard:
            self.kill()
        else:
            self.terminate()
        return self.start()

    def _close(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> WitnessProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.terminate()
        if self._tmp is not None:
            self._tmp.cleanup()
