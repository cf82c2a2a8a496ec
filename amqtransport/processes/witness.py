"""WitnessProcess: ``amq broker witness`` (the arbiter of replicated pairs) as a child process.

The port is fixed when the object is made (a free one unless given), so the nodes can
be given ``--witness HOST:PORT`` before the witness starts and a restart (the same
data directory: the witness's durable state) answers on the same address. The child's
log goes to ``<data_dir>/logs/witness-<n>.log``. Starting, stopping by pid and restarting
are :class:`~.child.ChildProcess`'s.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from types import TracebackType

from .child import ChildProcess
from .ports import free_port
from .spawn import private_dir

__all__ = ["WitnessProcess"]

READY_LINE = "witness listening on tcp://"


class WitnessProcess(ChildProcess):
    """One ``amq broker witness`` on ``host:port`` (port 0: a free one, fixed now)."""

    what = "witness"
    stop_timeout = 10.0
    kill_wait = 10.0

    def __init__(self, data_dir: str | Path | None = None, port: int = 0, *, host: str = "127.0.0.1",
                 startup_timeout: float = 30.0) -> None:
        super().__init__()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="amq-witness-")
            data_dir = self._tmp.name
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port or free_port(host)
        self.startup_timeout = startup_timeout

    @property
    def address(self) -> str:
        """What the nodes are given: ``--witness HOST:PORT``."""
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "amqtransport", "broker", "witness", "--port", str(self.port),
                "--host", self.host, "--data-dir", str(self.data_dir)]

    def log_file(self, start: int) -> Path:
        return private_dir(self.data_dir / "logs") / f"witness-{start}.log"

    def ready(self, line: str) -> bool:
        return line.startswith(READY_LINE)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        super().__exit__(exc_type, exc, tb)
        if self._tmp is not None:
            self._tmp.cleanup()
