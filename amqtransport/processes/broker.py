"""BrokerProcess: our broker (``amq broker run``) as a real child process.

For tests that must kill the broker the hard way (``kill -9``) and restart it on the
same data directory. The child's stderr (its log) goes to ``<log_dir>/broker-<n>.log``;
:meth:`BrokerProcess.log_text` returns it for assertion messages. The process is always
stopped on ``__exit__``, even when the test fails. Starting, stopping by pid and
restarting are :class:`~.child.ChildProcess`'s.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

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
        self.log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="amq-broker-log-"))
        self.env = env

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
