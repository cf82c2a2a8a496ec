"""BrokerProcess: our broker (``amq broker run``) as a real child process.

For tests that must kill the broker the hard way (``kill -9``) and restart it on the
same data directory. The child's stderr (its log) goes to ``<log_dir>/broker-<n>.log``;
:meth:`BrokerProcess.log_text` returns it for assertion messages. The process is always
stopped on ``__exit__``, even when the test fails. Starting, stopping by pid and
restarting are :class:`~.child.ChildProcess`'s.

*The log directory.* A ``log_dir`` the caller gives is the caller's: it is never
removed. Without one the process makes its own temporary directory
(``amq-broker-log-*``) and removes it when the object is stopped for good: by
:meth:`BrokerProcess.close`, which ``__exit__`` and :meth:`BrokerProcess.stop` call.
:meth:`~.child.ChildProcess.kill`, :meth:`~.child.ChildProcess.terminate` and
:meth:`~.child.ChildProcess.restart` keep it (the same object may start again). The
directory is kept anyway, and its path printed on stderr (where pytest shows it with
a failing test's output), when a run of the broker ended unexpectedly: it exited by
itself (a crash, or a start that never reported ready), or a clean stop did not end
with exit code 0. ``AMQ_KEEP_LOGS=1`` in the environment keeps every log directory.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from .child import ChildProcess

__all__ = ["BrokerProcess"]


class BrokerProcess(ChildProcess):
    what = "broker"

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
        super().__init__()
        self.data_dir = Path(data_dir)
        self.port = port
        self.host = host
        self.args = tuple(args)
        self.startup_timeout = startup_timeout
        #: the log directory is ours (a temporary one) only when the caller gave none
        self._owns_log_dir = log_dir is None
        self.log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="amq-broker-log-"))
        self.env = env
        #: why a run ended unexpectedly (module docstring), once one did: the log dir is then kept
        self.unexpected_exit: str | None = None
        self._stopping = False  # the current run's end is ours (kill/terminate), not the broker's

    @property
    def uri(self) -> str:
        return f"tcp://{self.host}:{self.port}"

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

    def log_file(self, start: int) -> Path:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return self.log_dir / f"broker-{start}.log"

    def ready(self, line: str) -> bool:
        """``listening on stomp://HOST:PORT``: where it serves (port 0 becomes the real one)."""
        if not line.startswith("listening on stomp://"):
            return False
        host, _, port = line.rsplit("stomp://", 1)[1].rpartition(":")
        self.host, self.port = host, int(port)
        return True

    # ---------------------------------------------------------------- noting how a run ended
    def start(self) -> Self:
        if self.alive:
            return self
        self._note_exit()  # a run that ended by itself since the last start
        self._stopping = False
        try:
            return super().start()
        except BaseException as exc:
            self.unexpected_exit = self.unexpected_exit or f"it did not start: {exc}".split("\n")[0]
            raise

    def _note_exit(self) -> None:
        """Record a run that ended without our kill or terminate."""
        if self.proc is not None and not self._stopping and self.proc.poll() is not None:
            self.unexpected_exit = self.unexpected_exit or f"it exited by itself (exit code {self.proc.returncode})"

    def kill(self) -> None:
        self._note_exit()
        self._stopping = True
        super().kill()

    def terminate(self, timeout: float | None = None) -> int | None:
        self._note_exit()
        running = self.alive
        self._stopping = True
        code = super().terminate(timeout)
        if running and code != 0:
            self.unexpected_exit = self.unexpected_exit or f"a clean stop ended with exit code {code}"
        return code

    # ---------------------------------------------------------------- stopping for good
    def close(self, timeout: float | None = None) -> int | None:
        """Stop it (SIGTERM, then SIGKILL after ``timeout``) for good and remove its own
        temporary log directory, unless a run ended unexpectedly or ``AMQ_KEEP_LOGS=1``
        (module docstring). The exit code, as :meth:`terminate`'s."""
        code = self.terminate(timeout)
        if not self._owns_log_dir or not self.log_dir.exists():
            return code
        if self.unexpected_exit is not None:
            print(f"amq: kept the log directory of broker {self.data_dir} ({self.unexpected_exit}): "
                  f"{self.log_dir}", file=sys.stderr)
        elif os.environ.get("AMQ_KEEP_LOGS") != "1":
            shutil.rmtree(self.log_dir, ignore_errors=True)
        return code

    def stop(self, timeout: float | None = None) -> int | None:
        """Stop it for good: :meth:`close`."""
        return self.close(timeout)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
