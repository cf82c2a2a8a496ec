"""EmbeddedBroker: a :class:`~.server.BrokerServer` on its own thread and event loop.

Sync code (tests, examples, ``vm://NAME`` URIs) never sees the loop: ``start()``
blocks until the broker listens (or raises what stopped it), ``stop()`` closes every
connection, flushes the journal and joins the thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from ..loop_thread import LoopThread
from .config import BrokerConfig
from .server import BrokerServer

__all__ = ["EmbeddedBroker"]

log = logging.getLogger(__name__)


class EmbeddedBroker:
    """A broker running in a background thread; a context manager.

    ``data_dir=None`` uses a private temporary directory removed on :meth:`stop`.
    """

    def __init__(
        self,
        port: int = 0,
        data_dir: str | Path | None = None,
        host: str = "127.0.0.1",
        name: str = "embedded",
        users: Mapping[str, str] | None = None,
        config: BrokerConfig | None = None,
    ) -> None:
        base = config or BrokerConfig()
        self.config = base.model_copy(update={"host": host, "port": port, "name": name})
        self._data_dir = data_dir
        self._users = users
        self._runner = LoopThread(f"broker:{self.config.name}")
        self._server: BrokerServer | None = None
        self.host = host
        self.port = port

    @property
    def uri(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    @property
    def server(self) -> BrokerServer:
        """The running server (for stats and tests); only valid between start and stop."""
        assert self._server is not None, "broker not started"
        return self._server

    def start(self, timeout: float = 30.0) -> EmbeddedBroker:
        """Start the broker thread; block until it listens (or raise what stopped it)."""
        self._runner.start(self._open, self._close, timeout)
        return self

    async def _open(self) -> None:
        server = BrokerServer(self.config, data_dir=self._data_dir, users=self._users)
        await server.start()
        self._server = server
        self.host, self.port = server.host, server.port

    async def _close(self) -> None:
        if self._server is not None:
            await self._server.stop()

    def call(self, fn: Any, *args: Any, timeout: float = 10.0) -> Any:
        """Run ``fn(*args)`` on the broker's loop and return its result (tests, stats)."""
        return self._runner.call(fn, *args, timeout=timeout)

    def stats(self) -> dict[str, object]:
        return self.call(lambda: self.server.stats())  # type: ignore[no-any-return]

    def stop(self, timeout: float = 30.0) -> None:
        if not self._runner.started:
            return
        if not self._runner.stop(timeout):
            log.error("embedded broker %s did not stop within %s s", self.config.name, timeout)
        self._server = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
