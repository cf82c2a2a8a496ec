"""Running the Toxiproxy-compatible server: in a background thread, or in the foreground.

- :class:`ChaosServer` is the asyncio part: the proxy collection plus the HTTP API,
  started and closed on the running loop.
- :class:`ToxiproxyServer` runs a :class:`ChaosServer` on its own loop in a daemon
  thread, so synchronous code (tests, scenarios) never sees a loop::

      with ToxiproxyServer(port=0) as server:
          Toxiproxy().update_api_consumer("127.0.0.1", server.port)

- :func:`serve_forever` runs one in the foreground until Ctrl-C or SIGTERM
  (``amq chaos proxy``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import signal
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from chaos.collection import ProxyCollection
from chaos.http_api import ToxiproxyApi
from chaos.http_server import HttpServer, start_http_server

__all__ = ["ChaosServer", "ToxiproxyServer", "serve_forever"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class ChaosServer:
    """The proxy collection and its HTTP API on the current event loop."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8474) -> None:
        self.host = host
        self.port = port
        self.collection = ProxyCollection()
        self._http: HttpServer | None = None

    async def start(self) -> None:
        self._http = await start_http_server(ToxiproxyApi(self.collection), self.host, self.port)
        self.port = self._http.port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
        self.collection.close()
        for _ in range(5):  # let aborted connections and pending accepts finish closing
            await asyncio.sleep(0)


class ToxiproxyServer:
    """A Toxiproxy-compatible server on a background thread (for tests and scenarios).

    ``port=0`` picks a free port; read it from ``.port`` after :meth:`start`.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._requested_port = port
        self._server: ChaosServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("ToxiproxyServer is not started")
        return self._server.port

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("ToxiproxyServer is not started")
        return self._server.url

    def start(self) -> ToxiproxyServer:
        """Start the loop thread and bind the API; raises ``OSError`` if the bind fails."""
        if self._thread is not None:
            return self
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=self._run,
            args=(ready,),
            name=f"toxiproxy-{self.host}:{self._requested_port}",
            daemon=True,
        )
        self._thread.start()
        try:
            ready.result(timeout=30)
        except BaseException:
            self._thread.join(timeout=5)
            self._thread = None
            raise
        return self

    def _run(self, ready: concurrent.futures.Future[None]) -> None:
        # asyncio.run cancels whatever is still pending (open connections) on the way out.
        asyncio.run(self._main(ready))

    async def _main(self, ready: concurrent.futures.Future[None]) -> None:
        server = ChaosServer(self.host, self._requested_port)
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        try:
            await server.start()
        except BaseException as exc:
            ready.set_exception(exc)
            return
        self._server = server
        ready.set_result(None)
        try:
            await self._stopped.wait()
        finally:
            await server.close()

    def call(self, fn: Callable[[ProxyCollection], T], timeout: float = 10.0) -> T:
        """Run ``fn(collection)`` on the server's loop and return its result.

        For tests that look inside (e.g. count a proxy's live connections).
        """
        if self._loop is None or self._server is None:
            raise RuntimeError("ToxiproxyServer is not started")
        collection = self._server.collection

        async def run() -> T:
            return fn(collection)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def stop(self) -> None:
        """Close the API, every proxy and every connection; join the thread."""
        thread, loop, stopped = self._thread, self._loop, self._stopped
        if thread is None:
            return
        if loop is not None and stopped is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopped.set)
        thread.join(timeout=10)
        self._thread = None
        self._server = None

    def __enter__(self) -> ToxiproxyServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve_forever(
    host: str = "127.0.0.1", port: int = 8474, on_ready: Callable[[str], Any] | None = None
) -> None:
    """Run the server in the foreground until SIGINT or SIGTERM, then stop cleanly."""

    async def main() -> None:
        server = ChaosServer(host, port)
        await server.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        if on_ready is not None:
            on_ready(server.url)
        try:
            await stop.wait()
        finally:
            log.info("shutting down")
            await server.close()

    asyncio.run(main())
