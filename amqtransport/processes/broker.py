"""BrokerProcess: our broker (``amq broker run``) as a real child process.

For tests that must kill the broker the hard way (``kill -9``) and restart it on the
same data directory. The child's stderr (its log) goes to ``<log_dir>/broker-<n>.log``;
:meth:`BrokerProcess.log_text` returns it for assertion messages. The process is always
stopped on ``__exit__``, even when the test fails.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from .spawn import kill_and_reap, read_log, spawn_logged, terminate_and_reap

__all__ = ["BrokerProcess"]


class BrokerProcess:
    def __init__(
        self,
        data_dir: str | Path,
        port: int = 0,
        args: Sequence[str] = (),
        *,
        host: str = "127.0.0.1",
        startup_timeout: float = 30.0,
        log_dir: str | Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port
        self.host = host
        self.args = tuple(args)
        self.startup_timeout = startup_timeout
        self.log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="amq-broker-log-"))
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self._starts = 0
        self.log_path: Path | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "broker process not started"
        return self.proc.pid

    @property
    def uri(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "amqtransport",
            "broker",
            "run",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            "--host",
            self.host,
            *self.args,
        ]

    def start(self) -> BrokerProcess:
        if self.alive:
            return self
        self._starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"broker-{self._starts}.log"
        self.proc = spawn_logged(self.command(), self.log_path, self.env)
        try:
            line = self._read_listening_line()
        except BaseException:
            self.kill()
            raise
        address = line.rsplit("stomp://", 1)[1]
        host, _, port = address.rpartition(":")
        self.host, self.port = host, int(port)
        return self

    def _read_listening_line(self) -> str:
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
                    for raw in buf.split(b"\n")[:-1]:
                        text = raw.decode("utf-8", "replace").strip()
                        if text.startswith("listening on stomp://"):
                            return text
                elif self.proc.poll() is not None:
                    break
        finally:
            sel.close()
        try:  # stdout closed: the process is exiting (give it a moment to be reaped)
            code: int | None = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        raise RuntimeError(
            f"broker did not report 'listening on' (exit code {code}; waited at most "
            f"{self.startup_timeout} s); stdout={buf!r}; log:\n{self.log_text()[-3000:]}"
        )

    def log_text(self) -> str:
        return read_log(self.log_path)

    def kill(self) -> None:
        """SIGKILL (no flush, no cleanup: a crash) and wait."""
        if self.proc is None:
            return
        kill_and_reap(self.proc)
        self._close_pipes()

    def terminate(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (a clean stop that flushes the journal); SIGKILL after ``timeout``."""
        if self.proc is None:
            return None
        code = terminate_and_reap(self.proc, timeout, kill_wait=30)
        self._close_pipes()
        return code

    stop = terminate

    def restart(self, *, hard: bool = False) -> BrokerProcess:
        """Stop (SIGKILL when ``hard``) and start again on the same data dir and port."""
        if hard:
            self.kill()
        else:
            self.terminate()
        return self.start()

    def _close_pipes(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.terminate()
