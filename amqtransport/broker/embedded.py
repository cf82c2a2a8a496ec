"""EmbeddedBroker: a :class:`~.server.BrokerServer` on its own thread and event loop.

Sync code (tests, examples, ``vm://NAME`` URIs) never sees the loop: ``start()``
blocks until the broker listens (or raises what stopped it), ``stop()`` closes every
connection, flushes the journal and joins the thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

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
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: BrokerServer | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stopping: asyncio.Event | None = None
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
        if self._thread is not None:
            return self
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._run, name=f"broker:{self.config.name}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"embedded broker {self.config.name} did not start within {timeout} s")
        if self._error is not None:
            self._thread.join(5)
            self._thread = None
            raise self._error
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            if not self._ready.is_set():
                self._error = exc
            else:
                log.exception("embedded broker %s crashed", self.config.name)
        finally:
            self._ready.set()
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        server = BrokerServer(self.config, data_dir=self._data_dir, users=self._users)
        await server.start()
        self._server = server
        self.host, self.port = server.host, server.port
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            await server.stop()

    def call(self, fn: Any, *args: Any, timeout: float = 10.0) -> Any:
        """Run ``fn(*args)`` on the broker's loop and return its result (tests, stats)."""
        assert self._loop is not None

        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def stats(self) -> dict[str, object]:
        return self.call(lambda: self.server.stats())  # type: ignore[no-any-return]

    def stop(self, timeout: float = 30.0) -> None:
        thread = self._thread
        if thread is None:
            return
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stopping.set)
            except RuntimeError:
                pass
        thread.join(timeout)
        if thread.is_alive():
            log.error("embedded broker %s did not stop within %s s", self.config.name, timeout)
        self._thread = None
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
