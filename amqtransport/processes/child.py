"""ChildProcess: one child process that says on stdout when it is ready, stopped by pid.

The part :class:`~.broker.BrokerProcess` (``amq broker run``) and
:class:`~.witness.WitnessProcess` (``amq broker witness``) share: start the command with
stdout on a pipe and stderr into ``<n>``-numbered log files (:func:`~.spawn.spawn_logged`),
wait for the line that says it serves (a subclass's :meth:`ChildProcess.ready`), and
stop it by pid: SIGKILL (a crash, :meth:`ChildProcess.kill`), SIGTERM then SIGKILL (a
clean stop, :meth:`ChildProcess.terminate`), or both and start again
(:meth:`ChildProcess.restart`: the same data directory, the same port).
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from .spawn import kill_and_reap, read_log, spawn_logged, terminate_and_reap

__all__ = ["ChildProcess"]


class ChildProcess:
    """A subclass sets ``what``, ``startup_timeout`` and the stop's waits and gives
    :meth:`command`, :meth:`log_file` and :meth:`ready`."""

    what = "process"  # for error messages
    stop_timeout = 20.0  # seconds a clean stop may take before SIGKILL
    kill_wait = 30.0  # seconds to wait for the SIGKILL that follows an unheeded SIGTERM
    startup_timeout: float
    env: dict[str, str] | None = None

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self._starts = 0

    # ---------------------------------------------------------------- what a subclass gives
    def command(self) -> list[str]:
        raise NotImplementedError

    def log_file(self, start: int) -> Path:
        """Where the ``start``-th run's stderr goes."""
        raise NotImplementedError

    def ready(self, line: str) -> bool:
        """Whether ``line`` (stripped) of stdout says the child serves."""
        raise NotImplementedError

    # ---------------------------------------------------------------- running
    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.what} not started"
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Self:
        """Start it and wait until it says it is ready (killed again if it does not)."""
        if self.alive:
            return self
        self._starts += 1
        self.log_path = self.log_file(self._starts)
        self.proc = spawn_logged(self.command(), self.log_path, self.env)
        try:
            self._wait_ready()
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_ready(self) -> str:
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
                        if self.ready(text):
                            return text
                elif self.proc.poll() is not None:
                    break
        finally:
            sel.close()
        try:  # stdout closed: the process is exiting (give it a moment to be reaped)
            code: int | None = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        raise RuntimeError(f"{self.what} did not report that it is ready (exit code {code}; waited at most "
                           f"{self.startup_timeout} s); stdout={buf!r}; log:\n{self.log_text()[-3000:]}")

    def log_text(self) -> str:
        return read_log(self.log_path)

    # ---------------------------------------------------------------- stopping
    def kill(self) -> None:
        """SIGKILL (no flush, no cleanup: a crash) and wait."""
        if self.proc is None:
            return
        kill_and_reap(self.proc)
        self._close_pipes()

    def terminate(self, timeout: float | None = None) -> int | None:
        """SIGTERM (a clean stop); SIGKILL after ``timeout`` (``stop_timeout``). The exit code."""
        if self.proc is None:
            return None
        code = terminate_and_reap(self.proc, self.stop_timeout if timeout is None else timeout,
                                  kill_wait=self.kill_wait)
        self._close_pipes()
        return code

    def stop(self, timeout: float | None = None) -> int | None:
        return self.terminate(timeout)

    def restart(self, *, hard: bool = False) -> Self:
        """Stop (SIGKILL when ``hard``) and start again on the same data and port."""
        if hard:
            self.kill()
        else:
            self.terminate()
        return self.start()

    def _close_pipes(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.terminate()
