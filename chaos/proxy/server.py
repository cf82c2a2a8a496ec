"""Running the Toxiproxy-compatible server: in a background thread, or in the foreground.

- :class:`ChaosServer` is the asyncio part: the proxy collection plus the HTTP API,
  started and closed on the running loop. The API is served by the broker's HTTP/1.1
  server (:class:`~amqtransport.broker.http.h11_server.HttpServer`, h11 under an
  asyncio ``Protocol``) with the limits of :data:`API_LIMITS` and Toxiproxy's JSON
  error answers.
- :class:`ToxiproxyServer` runs a :class:`ChaosServer` on its own loop in a daemon
  thread, so synchronous code (tests, scenarios) never sees a loop::

      with ToxiproxyServer(port=0) as server:
          Toxiproxy().update_api_consumer("127.0.0.1", server.port)

- :func:`serve_forever` runs one in the foreground until Ctrl-C or SIGTERM
  (``amq chaos proxy``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from amqtransport.broker.http.h11_server import HttpLimits, HttpServer
from amqtransport.loop_thread import LoopThread
from chaos.proxy.collection import ProxyCollection
from chaos.proxy.http_api import ToxiproxyApi, error_response

__all__ = ["API_LIMITS", "ChaosServer", "ToxiproxyServer", "serve_forever"]

#: the API's bounds: a 64 KiB head and an 8 MiB body (a large ``/populate``), and no
#: hurry -- a test's or a scenario's client may keep its connection idle for minutes
API_LIMITS = HttpLimits(max_head=64 * 1024, max_body=8 * 1024 * 1024, max_connections=256,
                        idle_timeout=600.0, request_timeout=60.0)

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
        http = HttpServer(ToxiproxyApi(self.collection), self.host, self.port, API_LIMITS, error_response)
        await http.start()
        self._http = http
        self.port = http.port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def close(self) -> None:
        if self._http is not None:
            await self._http.stop()
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
        # cancel_pending: open connections still pending after close() are cancelled on the way out.
        self._runner = LoopThread(f"toxiproxy-{host}:{port}", cancel_pending=True)

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
        self._runner.start(self._open, self._close, timeout=30)
        return self

    async def _open(self) -> None:
        server = ChaosServer(self.host, self._requested_port)
        await server.start()
        self._server = server

    async def _close(self) -> None:
        if self._server is not None:
            await self._server.close()

    def call(self, fn: Callable[[ProxyCollection], T], timeout: float = 10.0) -> T:
        """Run ``fn(collection)`` on the server's loop and return its result.

        For tests that look inside (e.g. count a proxy's live connections).
        """
        if self._server is None:
            raise RuntimeError("ToxiproxyServer is not started")
        return self._runner.call(fn, self._server.collection, timeout=timeout)

    def stop(self) -> None:
        """Close the API, every proxy and every connection; join the thread."""
        if not self._runner.started:
            return
        self._runner.stop(timeout=10)
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
